#!/usr/bin/env bash
# Load test: `glmflash serve` on the bench preset, driven by ghz (a gRPC load
# tool) at concurrency 1, 8 and 32 with a fixed request set: 32 distinct
# prompts of PROMPT_LEN tokens, greedy, exactly MAX_TOKENS tokens each (no
# stop ids). Run by `make loadtest` (which builds bin/glmflash and bin/ghz).
#
# Reported per level:
#   tokens/s      completion tokens (the server's glmflash_generated_tokens_total
#                 delta) / ghz's wall time for the level
#   TTFT p50/p99  exact, per request: the ttft_ms field of the server's
#                 "request finished" log lines (the same value as the
#                 timings.time_to_first_token of the final stream message;
#                 ghz itself only times whole calls)
#   call p50/p99  ghz's latency of the whole streaming call
#   errors        ghz's non-OK responses (the script fails unless 0)
#
# Knobs (environment): LEVELS ("1 8 32"), REQUESTS ("16 64 128": requests per
# level), PROMPT_LEN (16), MAX_TOKENS (16), PRESET (bench), VOCAB (below), PORT (50061),
# METRICS_PORT (9191), OUT (.cache/loadtest), DEVICE (cpu; cuda serves on the
# GPU).
set -euo pipefail
cd "$(dirname "$0")/.."

LEVELS=(${LEVELS:-1 8 32})
REQUESTS=(${REQUESTS:-16 64 128})
PROMPT_LEN=${PROMPT_LEN:-16}
MAX_TOKENS=${MAX_TOKENS:-16}
PRESET=${PRESET:-bench}
PORT=${PORT:-50061}
METRICS_PORT=${METRICS_PORT:-9191}
OUT=${OUT:-.cache/loadtest}
DEVICE=${DEVICE:-cpu}
BIN=bin/glmflash
GHZ=bin/ghz
ADDR=127.0.0.1:$PORT
METRICS=http://127.0.0.1:$METRICS_PORT/metrics

[ -x "$BIN" ] || { echo "missing $BIN (make build)"; exit 1; }
[ -x "$GHZ" ] || { echo "missing $GHZ (make bin/ghz)"; exit 1; }
mkdir -p "$OUT"
LOG=$OUT/server.log

# The fixed request set: prompt i has ids 1 + (i*131 + j*17 + j*j*7) mod
# (VOCAB-1), VOCAB the preset's vocab_size (default: 30001, within every
# preset but tiny's 256; VOCAB=256 for tiny).
VOCAB=${VOCAB:-$([ "$PRESET" = tiny ] && echo 256 || echo 30001)}
DATA=$OUT/requests.json
{
	echo "["
	for i in $(seq 0 31); do
		ids=""
		for j in $(seq 0 $((PROMPT_LEN - 1))); do
			ids="$ids${ids:+,}$(((i * 131 + j * 17 + j * j * 7) % (VOCAB - 1) + 1))"
		done
		sep=","
		[ "$i" = 31 ] && sep=""
		echo "  {\"prompt_ids\":[$ids],\"max_tokens\":$MAX_TOKENS,\"sampling\":{\"temperature\":0}}$sep"
	done
	echo "]"
} >"$DATA"

# The server: configs/serve.yaml with the bench preset and 32 slots, on
# ports of its own.
export GLMFLASH_MODEL__PRESET=$PRESET
export GLMFLASH_SERVER__GRPC_ADDR=$ADDR
export GLMFLASH_SERVER__METRICS_ADDR=127.0.0.1:$METRICS_PORT
export GLMFLASH_SERVER__HTTP_ADDR=""
export GLMFLASH_SERVER__DRAIN_TIMEOUT=10s
export GLMFLASH_RUNTIME__SLOTS=32
export GLMFLASH_RUNTIME__MAX_RUNNING=32
export GLMFLASH_RUNTIME__MAX_QUEUE=64
export GLMFLASH_RUNTIME__MAX_BATCH_TOKENS=${MAX_BATCH_TOKENS:-128}
export GLMFLASH_RUNTIME__PREFILL_CHUNK=${PREFILL_CHUNK:-64}
"$BIN" --log-format json serve --device "$DEVICE" >"$OUT/server.out" 2>"$LOG" &
SERVER=$!
cleanup() {
	if kill -0 "$SERVER" 2>/dev/null; then
		kill -TERM "$SERVER"
		wait "$SERVER" || true
	fi
}
trap cleanup EXIT

echo "waiting for the server ($PRESET preset on $DEVICE; the first run writes the checkpoint)..."
for _ in $(seq 1 600); do
	grep -q '"serving (health: SERVING)"' "$LOG" 2>/dev/null && break
	kill -0 "$SERVER" 2>/dev/null || { echo "the server exited:"; cat "$LOG"; exit 1; }
	sleep 1
done
grep -q '"serving (health: SERVING)"' "$LOG" || { echo "the server did not become ready"; exit 1; }

metric() { # metric NAME: its value on the metrics endpoint
	curl -s "$METRICS" | awk -v n="$1" '$1 == n { print $2 }'
}
ghz_run() { # ghz_run CONCURRENCY REQUESTS JSON_OUT
	"$GHZ" --insecure --call glmflash.v1.GLMFlash/Generate --data-file "$DATA" \
		-c "$1" -n "$2" --connections 1 --timeout 600s --format json -o "$3" "$ADDR"
}
wall_ns() { # wall_ns FILE: ghz's total time of the run (the "total" after "count")
	grep -o '"count":[0-9]*,"total":[0-9]*' "$1" | head -1 | sed 's/.*"total"://'
}
percentile() { # percentile P < sorted numbers (nearest rank)
	awk -v p="$1" '{ v[NR] = $1 } END { if (NR == 0) { print "n/a"; exit } i = int(p / 100 * NR + 0.999999); if (i < 1) i = 1; if (i > NR) i = NR; printf "%.0f", v[i] }'
}

echo "warm-up..."
ghz_run 1 2 "$OUT/warmup.json" >/dev/null

SUMMARY=$OUT/summary.txt
printf "%-11s %8s %8s %10s %12s %10s %10s %12s %12s %6s\n" concurrency requests tokens wall_s tokens_per_s ttft_p50 ttft_p99 call_p50_ms call_p99_ms errors | tee "$SUMMARY"
for k in "${!LEVELS[@]}"; do
	c=${LEVELS[$k]}
	n=${REQUESTS[$k]}
	tok0=$(metric glmflash_generated_tokens_total)
	line0=$(wc -l <"$LOG")
	ghz_run "$c" "$n" "$OUT/ghz-c$c.json"
	tok1=$(metric glmflash_generated_tokens_total)
	tokens=$(awk -v a="$tok0" -v b="$tok1" 'BEGIN { printf "%d", b - a }')
	total_ns=$(wall_ns "$OUT/ghz-c$c.json")
	ok=$(grep -o '"statusCodeDistribution":{[^}]*}' "$OUT/ghz-c$c.json" | grep -o '"OK":[0-9]*' | cut -d: -f2)
	errors=$((n - ${ok:-0}))
	wall=$(awk -v t="$total_ns" 'BEGIN { printf "%.1f", t / 1e9 }')
	tps=$(awk -v n="$tokens" -v t="$total_ns" 'BEGIN { printf "%.1f", n / (t / 1e9) }')
	tail -n +"$((line0 + 1))" "$LOG" | grep '"request finished"' | grep -o '"ttft_ms":[0-9.]*' | cut -d: -f2 | sort -n >"$OUT/ttft-c$c.txt"
	p50=$(percentile 50 <"$OUT/ttft-c$c.txt")
	p99=$(percentile 99 <"$OUT/ttft-c$c.txt")
	# ghz's whole-call latencies (ns) from its per-request details
	grep -o '"latency":[0-9]*' "$OUT/ghz-c$c.json" | cut -d: -f2 | awk '{ printf "%.0f\n", $1 / 1e6 }' | sort -n >"$OUT/call-c$c.txt"
	c50=$(percentile 50 <"$OUT/call-c$c.txt")
	c99=$(percentile 99 <"$OUT/call-c$c.txt")
	printf "%-11s %8s %8s %10s %12s %8sms %8sms %12s %12s %6s\n" "$c" "$n" "$tokens" "$wall" "$tps" "$p50" "$p99" "$c50" "$c99" "$errors" | tee -a "$SUMMARY"
	failed=$((${failed:-0} + errors))
done
echo "(prompts of $PROMPT_LEN tokens, $MAX_TOKENS generated tokens each, greedy; preset $PRESET; $(nproc) cores)" | tee -a "$SUMMARY"
echo "server metrics at the end:" >>"$SUMMARY"
curl -s "$METRICS" | grep -E '^glmflash_(requests_total|generated_tokens_total|prompt_tokens_total|batch_size_(sum|count)|batch_tokens_(sum|count))' >>"$SUMMARY" || true
echo "details: $OUT (ghz-c*.json, ttft-c*.txt, server.log, summary.txt)"
if [ "${failed:-0}" != 0 ]; then
	echo "FAIL: $failed calls failed (see $OUT/ghz-c*.json)"
	exit 1
fi
