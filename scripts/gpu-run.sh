#!/usr/bin/env bash
# One call on the GPU machine, as the device tool runs it: compile the PTX
# with that machine's nvcc, run every CUDA test, the transformers fixtures
# through `glmflash eval --device cuda` (no passes, every pass, every pass +
# the example plugin), the GEMM kernels' micro-benchmark (step kbench), a
# bench, speculative decoding's bench (step spec), and a bounded load test against
# `glmflash serve --device cuda`, and (step gpupreset, not in the default
# steps) the gpu preset's bench, eval and the transformers benchmark, and
# (step mask, not in the default steps either) the logits processing's
# cost: BenchmarkLogitsProcess and `bench --sample-mask` on the bench
# preset and, where gpupreset's checkpoint is (or GPU_CKPT), the gpu
# preset at batch 64. Binaries come prebuilt from this machine in
# bin/ (make gpu-bundle). gpupreset's knobs: GPU_CKPT (where the checkpoint is), GPU_SET
# ("FIELD=VALUE ..." scales it, e.g. n_routed_experts=16), GPU_BENCH ("prec:prompt ..."),
# GPU_BATCH, GPU_CONFIG (the benches' --config; default configs/presets/cuda.yaml, none: GPU_CONFIG=), GPU_GEMM_REPORT=0, GPU_PROFILE (a precision: a per-op profile; GPU_PROFILE_BATCH,
# GPU_PROFILE_PROMPT), GPU_NO_EVAL, GPU_NO_HF, HF_FP8, HF_LIMIT, GPU_REPS. Everything lands in $OUT (default /tmp/gpu-run),
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
mask)
	log "logits processing on the device (BenchmarkLogitsProcess: the sampler's launches, 154880 logits a row)"
	(cd kernels/cuda && timeout "$LIMIT" ../../bin/gpu-tests/kernels_cuda.test -test.run - -test.bench LogitsProcess -test.benchtime 20x) >"$OUT/logs/mask-kbench.log" 2>&1 || log "mask kbench FAILED"
	grep -E '^Benchmark' "$OUT/logs/mask-kbench.log" | awk '{ for (i = 2; i <= NF; i++) if ($i == "us/step") printf "%-55s %10s us/step\n", $1, $(i-1) }' >>"$OUT/logs/summary.txt"
	log "bench --device cuda --preset bench --sample-mask"
	timeout "$LIMIT" bin/glmflash bench --device cuda --preset bench --prompt 64 --batch 1,8,64 --reps 5 --decode-steps 16 --sample-mask --gemm-report=false \
		--json "$OUT/logs/mask-bench.json" >"$OUT/logs/mask-bench.log" 2>&1 || log "bench --sample-mask FAILED"
	CK=${GPU_CKPT:-/dev/shm/glmflash-gpu}
	[ -d "$CK" ] || CK=/tmp/glmflash-gpu
	if [ -f "$CK/model.safetensors.index.json" ] || [ -f "$CK/model.safetensors" ]; then
		log "bench --device cuda --model gpu-preset --precision bf16 --batch 64 --sample-mask"
		timeout "$LIMIT" bin/glmflash bench --device cuda --model "$CK" --config configs/presets/cuda.yaml --precision bf16 --prompt 64 --batch 64 --reps 5 --decode-steps 16 --sample-mask --gemm-report=false \
			--json "$OUT/logs/mask-gpu-bench.json" >>"$OUT/logs/mask-bench.log" 2>&1 || log "bench --sample-mask (gpu preset) FAILED"
	else
		log "no gpu preset checkpoint at $CK (step gpupreset writes it, or set GPU_CKPT): the gpu preset's --sample-mask not measured"
	fi
	grep -E "tokens/s|logits processing" "$OUT/logs/mask-bench.log" >>"$OUT/logs/summary.txt"
	;;
spec)
	log "bench --device cuda --preset bench-mtp --speculative mtp:5 --spec-accept 0.6,0.8,1.0 (and the MTP drafter)"
	timeout "$LIMIT" bin/glmflash bench --device cuda --preset bench-mtp --speculative mtp:5 --spec-accept 0.6,0.8,1.0 --prompt 128 --decode-steps 48 --batch 1,4 --reps 3 \
		--json "$OUT/logs/bench-spec.json" >"$OUT/logs/bench-spec.log" 2>&1 || log "bench --speculative FAILED"
	grep -E "tokens/s|acceptance" "$OUT/logs/bench-spec.log" | tail -n 20 >>"$OUT/logs/summary.txt"
	;;
gpupreset)
	# the gpu preset (released per-layer sizes, 8 layers, FP8): written where
	# it fits (tmpfs first), then bench in fp32 and bf16, eval bf16 against
	# fp32, and transformers on the same checkpoint (tools/hf_bench.py)
	CK=${GPU_CKPT:-}
	if [ -z "$CK" ]; then
		if [ "$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)" -gt 50000000 ] 2>/dev/null; then CK=/dev/shm/glmflash-gpu; else CK=/tmp/glmflash-gpu; fi
	fi
	df -h /dev/shm /tmp >>"$OUT/logs/summary.txt" 2>&1
	if [ ! -f "$CK/model.safetensors.index.json" ] && [ ! -f "$CK/model.safetensors" ]; then
		log "init-random --preset gpu --fp8 --out $CK"
		setf=""; for kv in ${GPU_SET:-}; do setf="$setf --set $kv"; done
		/usr/bin/time -v bin/glmflash init-random --preset gpu --fp8 $setf --shard-mib 4096 --out "$CK" --force >"$OUT/logs/gpu-init.log" 2>&1 || log "init-random FAILED"
		grep -E 'wrote|Elapsed|Maximum resident' "$OUT/logs/gpu-init.log" >>"$OUT/logs/summary.txt"
		du -sh "$CK" >>"$OUT/logs/summary.txt"
	fi
	cfgf=""; [ -n "${GPU_CONFIG-configs/presets/cuda.yaml}" ] && cfgf="--config ${GPU_CONFIG-configs/presets/cuda.yaml}"
	for run in ${GPU_BENCH-fp32:512 fp32:4096 bf16:512 bf16:4096}; do
		set -- ${run/:/ }
		log "bench --device cuda --model gpu-preset --precision $1 --prompt $2 $cfgf"
		timeout "$LIMIT" bin/glmflash bench --device cuda --model "$CK" $cfgf --precision "$1" --prompt "$2" --batch ${GPU_BATCH:-1,8,64} --reps ${GPU_REPS:-3} --decode-steps 16 \
			$( [ "${GPU_GEMM_REPORT:-1}" = 0 ] && echo --gemm-report=false ) --json "$OUT/logs/gpu-bench-$1-$2.json" >"$OUT/logs/gpu-bench-$1-$2.log" 2>&1 || log "bench FAILED"
		grep -vE '^\S+ +(DBG|INF) ' "$OUT/logs/gpu-bench-$1-$2.log" | tail -n 60 >>"$OUT/logs/summary.txt"
	done
	if [ -n "${GPU_PROFILE:-}" ]; then
		log "bench --profile-ops (gpu preset, $GPU_PROFILE)"
		timeout "$LIMIT" bin/glmflash bench --device cuda --model "$CK" $cfgf --precision "$GPU_PROFILE" --profile-ops --prompt ${GPU_PROFILE_PROMPT:-512} --batch ${GPU_PROFILE_BATCH:-1} --reps 1 --decode-steps 8 --gemm-report=false \
			>"$OUT/logs/gpu-profile.log" 2>&1 || log "profile FAILED"
		grep -vE '^\S+ +(DBG|INF) ' "$OUT/logs/gpu-profile.log" | head -n 80 >>"$OUT/logs/summary.txt"
	fi
	if [ -z "${GPU_NO_EVAL:-}" ]; then
		log "eval --precision bf16 --versus fp32 (gpu preset)"
		timeout "$LIMIT" bin/glmflash eval --device cuda --model "$CK" --precision bf16 --versus fp32 --prompt-len 128 --prompts 2 --steps 16 \
			>"$OUT/logs/gpu-eval-bf16.log" 2>&1 || log "eval --versus FAILED"
		grep -vE '^\S+ +(DBG|INF) ' "$OUT/logs/gpu-eval-bf16.log" | tail -n 12 >>"$OUT/logs/summary.txt"
	fi
	if [ -z "${GPU_NO_HF:-}" ] && [ -f tools/hf_bench.py ]; then
		log "transformers on the same checkpoint (tools/hf_bench.py)"
		timeout "${HF_LIMIT:-$LIMIT}" python3 tools/hf_bench.py --model "$CK" --fp8 ${HF_FP8:-auto} --prompts 512,4096 --batches 1,8,64 --decode-steps 16 --reps ${GPU_REPS:-3} \
			--json "$OUT/logs/hf-bench.json" >"$OUT/logs/hf-bench.log" 2>&1 || log "hf_bench FAILED"
		tail -n 40 "$OUT/logs/hf-bench.log" >>"$OUT/logs/summary.txt"
	fi
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
