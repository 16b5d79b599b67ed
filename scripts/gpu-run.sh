#!/usr/bin/env bash
# One call on the GPU machine, as the device tool runs it: compile the PTX
# with that machine's nvcc, run every CUDA test, the transformers fixtures
# through `glmflash eval --device cuda` (no passes, every pass, every pass +
# the example plugin), the GEMM kernels' micro-benchmark (step kbench), a
# bench, speculative decoding's bench (step spec), and a bounded load test against
# `glmflash serve --device cuda`. Binaries come prebuilt from this machine in
# bin/ (make gpu-bundle). Everything lands in $OUT (default /tmp/gpu-run),
# the PTX and the logs also packed in $OUT/gpu-run.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-run}
STEPS=${STEPS:-ptx tests kbench eval bench spec load}
DEST=${DEST:-$OUT}
LIMIT=${STEP_LIMIT:-240}
mkdir -p "$OUT/logs" "$OUT/ptx"
log() { echo "== $(date +%T) $*" | tee -a "$OUT/logs/summary.txt"; }
[ -f bin/gpu-bundle.tgz ] && tar xzf bin/gpu-bundle.tgz -C bin
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi >"$OUT/logs/nvidia-smi.txt" 2>&1
for s in $STEPS; do case $s in
ptx)
	log "ptx"
	OUT_DIR="$OUT/ptx" scripts/ptx.sh >>"$OUT/logs/summary.txt" 2>&1 || log "ptx FAILED"
	nvcc -cubin -arch=sm_90 -Xptxas -v -o /tmp/glmflash.cubin kernels/cuda/src/all.cu >"$OUT/logs/ptxas.txt" 2>&1 || log "ptxas report FAILED"
	export GLMFLASH_CUDA_PTX_DIR="$OUT/ptx"
	;;
tests)
	log "test-gpu"
	if command -v make >/dev/null; then tg="make --no-print-directory test-gpu"; else tg=scripts/test-gpu.sh; fi
	log "($tg)"
	timeout "$LIMIT" $tg >"$OUT/logs/test-gpu.log" 2>&1 && log "test-gpu ok" || log "test-gpu FAILED"
	grep -E -- '^(--- |ok|FAIL|PASS|=== RUN|== )|max\|Δ\||launches' "$OUT/logs/test-gpu.log" | tail -n 80 >>"$OUT/logs/summary.txt"
	;;
kbench)
	log "GEMM kernels on decode shapes (BenchmarkGemmDecode, peers: cuBLAS bf16, copy)"
	(cd kernels/cuda && timeout "$LIMIT" ../../bin/gpu-tests/kernels_cuda.test -test.run - -test.bench GemmDecode -test.benchtime 20x) >"$OUT/logs/kbench.log" 2>&1 || log "kbench FAILED"
	grep -E '^Benchmark' "$OUT/logs/kbench.log" | awk '{ printf "%-55s %10s us/launch %10s GB/s\n", $1, $5, $7 }' >>"$OUT/logs/summary.txt"
	;;
eval)
	for f in testdata/glm5next-tiny-*; do
		for cfg in configs/presets/baseline.yaml configs/engine.yaml; do
			log "eval $f $cfg"
			timeout "$LIMIT" bin/glmflash eval --device cuda --config "$cfg" --model "$f/checkpoint" --reference "$f/reference.safetensors" >>"$OUT/logs/eval.log" 2>&1 && log "ok" || log "eval FAILED"
		done
	done
	if [ -x bin/plugins/glmflash-pass-shared-expert-fusion ]; then
		log "eval with the example plugin"
		timeout "$LIMIT" bin/glmflash eval --device cuda --config configs/presets/plugin-example.yaml --model testdata/glm5next-tiny-a/checkpoint \
			--reference testdata/glm5next-tiny-a/reference.safetensors >>"$OUT/logs/eval.log" 2>&1 && log "ok" || log "eval with plugin FAILED"
	fi
	tail -n 60 "$OUT/logs/eval.log" >>"$OUT/logs/summary.txt"
	;;
bench)
	for cfg in configs/presets/baseline.yaml configs/engine.yaml; do
		for p in 512 4096; do
			log "bench --device cuda --preset bench --config $cfg --prompt $p"
			timeout "$LIMIT" bin/glmflash bench --device cuda --preset bench --config "$cfg" --prompt $p --batch 1,8,64 --reps 3 \
				--json "$OUT/logs/bench-$(basename "$cfg" .yaml)-$p.json" >>"$OUT/logs/bench.log" 2>&1 || log "bench FAILED"
		done
	done
	for prec in fp32 bf16; do
		log "bench --device cuda --preset bench --precision $prec --profile-ops"
		timeout "$LIMIT" bin/glmflash bench --device cuda --preset bench --precision $prec --profile-ops --batch 1,8 --reps 2 \
			>>"$OUT/logs/bench-profile.log" 2>&1 || log "bench --profile-ops FAILED"
		log "bench --device cuda --preset bench --precision $prec (graphs on)"
		timeout "$LIMIT" bin/glmflash bench --device cuda --preset bench --precision $prec --prompt 4096 --batch 1,8,64 --reps 3 \
			--json "$OUT/logs/bench-$prec.json" >>"$OUT/logs/bench.log" 2>&1 || log "bench FAILED"
	done
	grep -E "tokens/s|per step|device  " "$OUT/logs/bench.log" | tail -n 40 >>"$OUT/logs/summary.txt"
	;;
spec)
	log "bench --device cuda --preset bench-mtp --speculative mtp:5 --spec-accept 0.6,0.8,1.0 (and the MTP drafter)"
	timeout "$LIMIT" bin/glmflash bench --device cuda --preset bench-mtp --speculative mtp:5 --spec-accept 0.6,0.8,1.0 --prompt 128 --decode-steps 48 --batch 1,4 --reps 3 \
		--json "$OUT/logs/bench-spec.json" >"$OUT/logs/bench-spec.log" 2>&1 || log "bench --speculative FAILED"
	grep -E "tokens/s|acceptance" "$OUT/logs/bench-spec.log" | tail -n 20 >>"$OUT/logs/summary.txt"
	;;
load)
	log "load test (ghz) against serve --device cuda"
	DEVICE=cuda OUT="$OUT/loadtest" timeout "$LIMIT" scripts/loadtest.sh >"$OUT/logs/loadtest.log" 2>&1 && log "load ok" || log "load FAILED"
	tail -n 30 "$OUT/logs/loadtest.log" >>"$OUT/logs/summary.txt"
	;;
esac
	mkdir -p "$DEST"
	tar czf "$DEST/gpu-run.tgz" -C "$OUT" ptx logs $( [ -d "$OUT/loadtest" ] && echo loadtest ) 2>/dev/null
	cp "$OUT/logs/summary.txt" "$DEST/summary.txt"
done
cat "$OUT/logs/summary.txt"
