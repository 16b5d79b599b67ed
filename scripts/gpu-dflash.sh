#!/usr/bin/env bash
# Issue 35's device evidence, on the H200 machine (binaries from make
# gpu-bundle in bin/): the DFlash drafter on the gpu preset — its trunk as
# --load-format dummy weights, its drafter a random gpu-dflash one written by
# init-random --drafter-only — pinned at acceptance lengths 4, 6 and 8 (step
# dflash), MTP 5-1-6 on gpu-mtp pinned at 4 and 6 and mtp:7 at 8 (step mtp),
# and the block attention kernel's micro-benchmark (step kbench). Knobs:
# STEPS, PROMPT, DECODE, BATCH, REPS, LIMIT (seconds a step), OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-dflash}
STEPS=${STEPS:-dflash mtp kbench}
LIMIT=${LIMIT:-240}
mkdir -p "$OUT"
common=(--device cuda --config configs/presets/cuda.yaml --precision bf16 --load-format dummy
	--prompt "${PROMPT:-1024}" --decode-steps "${DECODE:-64}" --batch "${BATCH:-1,16}" --reps "${REPS:-3}" --warmup 1)
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
for s in $STEPS; do case $s in
dflash)
	log "init-random --preset gpu-dflash --drafter-only"
	bin/glmflash init-random --preset gpu-dflash --drafter-only --out /dev/shm/gd --force >"$OUT/init.log" 2>&1 || log "init FAILED"
	log "bench gpu (dummy) --speculative dflash --spec-accept-len 4,6,8"
	timeout "$LIMIT" bin/glmflash bench "${common[@]}" --preset gpu --speculative dflash --draft-model /dev/shm/gd/dflash \
		--spec-accept-len 4,6,8 --json "$OUT/dflash.json" >"$OUT/dflash.log" 2>&1 || log "dflash bench FAILED"
	grep -v '^\S*[0-9][0-9]:[0-9][0-9]:[0-9][0-9] ' "$OUT/dflash.log" | tail -n 40 >>"$OUT/summary.txt"
	;;
mtp)
	for m in "mtp:5 4,6" "mtp:7 8"; do
		set -- $m
		log "bench gpu-mtp (dummy) --speculative $1 --spec-accept-len $2"
		timeout "$LIMIT" bin/glmflash bench "${common[@]}" --preset gpu-mtp --speculative "$1" --spec-accept-len "$2" \
			--json "$OUT/${1/:/}.json" >"$OUT/${1/:/}.log" 2>&1 || log "$1 bench FAILED"
		grep -v '^\S*[0-9][0-9]:[0-9][0-9]:[0-9][0-9] ' "$OUT/${1/:/}.log" | tail -n 30 >>"$OUT/summary.txt"
	done
	;;
kbench)
	log "BenchmarkDFlashAttn"
	(cd kernels/cuda && timeout "$LIMIT" ../../bin/gpu-tests/kernels_cuda.test -test.run - -test.bench DFlashAttn -test.benchtime 50x) >"$OUT/kbench.log" 2>&1 || log "kbench FAILED"
	grep -E '^Benchmark' "$OUT/kbench.log" >>"$OUT/summary.txt"
	;;
*) log "unknown step $s" ;;
esac; done
