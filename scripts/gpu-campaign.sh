#!/usr/bin/env bash
# One call on the GPU machine (about 6 minutes on an H200): every CUDA test (with this issue's
# pieces: cuBLASLt, the GEMM tuner, each pass's parity and mechanisms on the device, the
# micro-benchmark, a study on the device), the H200 attribution campaign (configs/studies/campaign-h200.yaml:
# six cells, 13 arms with the A/A arm, adaptive rounds within 180 s) and the per-pass
# micro-benchmarks (`glmflash passes bench`: each pass on and off, launches, kernels, host syncs
# and device time per step), with the tuning table prefill-autotune measured there. The
# binaries come built from this machine (`make gpu-campaign-bundle`: bin/gpu-campaign.tgz, pure
# Go; carry it, or bin/glmflash alone without the tests); no Go, nvcc or network is needed there.
#
#   OUT=/tmp/out scripts/gpu-campaign.sh          # on the GPU machine, from the repository root
#
# Everything lands in $OUT (default /tmp/gpu-campaign):
#   tests.txt           the CUDA tests' verbose log (step "tests"; GPU_TESTS narrows them)
#   campaign/           the study's report.md, results.jsonl, intervals.jsonl, summary.json, charts
#   campaign.txt        its console tables (intervals, A/A noise floor, counters per step)
#   passes-baseline.*   each pass alone against no passes (.txt table, .json)
#   passes-all.*        every pass against every pass but one (.txt, .json)
#   tuning/             the tuning table(s) prefill-autotune measured (configs/tuning/cuda-*.json)
#   summary.txt         what ran, how long, what failed
# With DEST set, all of it is also packed into $DEST/gpu-campaign.tgz (one file to bring back).
# Knobs (for a dry run elsewhere, e.g. on the CUDA emulator with a shrunk study): STUDY, PRESET,
# PB_BATCH, PB_STEPS, PB_ROUNDS, PB_PROMPT, STEPS (default "tests study passes"), GLMFLASH.
# The gpu preset's campaign (issue 11):
#   STUDY=configs/studies/campaign-gpu.yaml PRESET=gpu PB_MODEL_FLAGS=--fp8 PB_PRECISION=bf16 \
#     CACHE_DIR=/dev/shm/glmflash-cache scripts/gpu-campaign.sh
# CACHE_DIR is where presets are written (the study writes its checkpoint there on first use;
# passes bench then finds it); PB_MODEL_FLAGS are extra model flags of `passes bench`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-campaign}
GLMFLASH=${GLMFLASH:-bin/glmflash}
STUDY=${STUDY:-configs/studies/campaign-h200.yaml}
PRESET=${PRESET:-bench}
PB_PROMPT=${PB_PROMPT:-512}
PB_BATCH=${PB_BATCH:-1,8,64}
PB_STEPS=${PB_STEPS:-8}
PB_ROUNDS=${PB_ROUNDS:-5}
STEPS=${STEPS:-tests study passes}
PB_MODEL_FLAGS=${PB_MODEL_FLAGS:-}
PB_PRECISION=${PB_PRECISION:-fp32}
STUDY_TIMEOUT=${STUDY_TIMEOUT:-360}
if [ -n "${CACHE_DIR:-}" ]; then export GLMFLASH_MODEL__CACHE_DIR=$CACHE_DIR; fi
GPU_TESTS=${GPU_TESTS:-.}   # every CUDA test (about half a minute on an H200)
mkdir -p "$OUT/tuning"
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
[ -f bin/gpu-campaign.tgz ] && tar xzf bin/gpu-campaign.tgz -C bin
[ -x "$GLMFLASH" ] || { log "no $GLMFLASH: build it with make build and carry it"; exit 1; }
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
"$GLMFLASH" --version >>"$OUT/summary.txt" 2>&1
status=0
t0=$(date +%s)
for s in $STEPS; do case $s in
tests)
	if [ -d bin/gpu-tests ]; then
		log "CUDA tests: $GPU_TESTS"
		GPU_TEST_RUN="$GPU_TESTS" timeout 150 scripts/test-gpu.sh >"$OUT/tests.txt" 2>&1 && log "tests ok" || { log "tests FAILED (see tests.txt)"; status=1; }
		grep -E -- '^(--- |ok|FAIL|PASS)' "$OUT/tests.txt" >>"$OUT/summary.txt"
	else
		log "no bin/gpu-tests (make gpu-campaign-bundle): tests skipped"
	fi
	;;
study)
	log "attribute --study $STUDY"
	timeout "$STUDY_TIMEOUT" "$GLMFLASH" attribute --study "$STUDY" --out "$OUT/campaign" >"$OUT/campaign.txt" 2>"$OUT/campaign-progress.log" \
		&& log "study ok ($(($(date +%s) - t0)) s so far)" || { log "study FAILED (see campaign.txt)"; status=1; }
	;;
passes)
	# after the study: prefill-autotune's arm uses the table the study measured
	for against in baseline all; do
		rounds=$PB_ROUNDS
		[ "$against" = all ] && rounds=$((PB_ROUNDS > 3 ? PB_ROUNDS - 2 : PB_ROUNDS))
		log "passes bench --against $against ($rounds rounds)"
		timeout 200 "$GLMFLASH" passes bench --device cuda --preset "$PRESET" $PB_MODEL_FLAGS --precision "$PB_PRECISION" --against "$against" --prompt "$PB_PROMPT" --batch "$PB_BATCH" \
			--steps "$PB_STEPS" --rounds "$rounds" --warmup 1 --json "$OUT/passes-$against.json" --log-level warn >"$OUT/passes-$against.txt" 2>&1 \
			&& log "passes bench $against ok ($(($(date +%s) - t0)) s so far)" || { log "passes bench $against FAILED"; status=1; }
	done
	;;
esac; done
cp configs/tuning/cuda-*.json "$OUT/tuning/" 2>/dev/null || log "no CUDA tuning table was written"
[ -f "$OUT/campaign.txt" ] && tail -n 60 "$OUT/campaign.txt" >>"$OUT/summary.txt"
for f in "$OUT"/passes-*.txt; do [ -f "$f" ] && cat "$f" >>"$OUT/summary.txt"; done
log "done in $(($(date +%s) - t0)) s (status $status)"
if [ -n "${DEST:-}" ]; then # one file to bring back (the device tool returns few files)
	mkdir -p "$DEST" && tar czf "$DEST/gpu-campaign.tgz" -C "$OUT" . && cp "$OUT/summary.txt" "$DEST/campaign-summary.txt"
fi
cat "$OUT/summary.txt"
exit $status
