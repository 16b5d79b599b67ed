#!/usr/bin/env bash
# Part of `make test`: the kernels' tests and the fixture parity suite once
# more per kernel implementation this CPU offers besides its best (which the
# plain `go test ./...` ran), and the arm64 build.
#   avx2  on an AVX-512 CPU: AVX-512 masked (GODEBUG=cpu.avx512f=off, which
#         golang.org/x/sys/cpu honours, so the process takes the AVX2 paths
#         an AVX2-only machine takes), with the CLI and plugin parity steps;
#   go    always: -tags purego, no assembly compiled at all (what arm64 and
#         CPUs without AVX2 run).
# TestKernelImplementation fails a run whose kernels are not the ones named.
set -euo pipefail
GO=${GO:-go}
PARITY='^(TestKernelImplementation|TestTransformersParity|TestMTPTransformersParity|TestTrunkFinalHiddenMatchesTransformers|TestMTPMatchesFloat64Reference|TestPassParityOnFixtures|TestFP8CheckpointMatchesDequantizedBF16)$'
CLI='^(TestKernelImplementation|TestEvalPassesOnFixture|TestEvalRunsMTPReference|TestEvalPassesWithEveryPreset|TestPluginCLI|TestPluginExampleSubprocess)$'

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }

echo "== arm64: go vet and go build (pure-Go kernels)"
GOARCH=arm64 $GO vet ./...
GOARCH=arm64 CGO_ENABLED=0 $GO build ./...

if [ "$(uname -m)" = x86_64 ] && has avx512f && has avx2 && has fma; then
	echo "== kernels: avx2 (AVX-512 masked: GODEBUG=cpu.avx512f=off)"
	export GODEBUG=cpu.avx512f=off GLMFLASH_EXPECT_KERNELS=avx2
	$GO test -count=1 ./kernels/... ./internal/cpulimits ./tools/limits
	$GO test -count=1 -run "$PARITY" ./tests
	$GO test -count=1 -run "$CLI" ./tests ./cmd/glmflash
	unset GODEBUG GLMFLASH_EXPECT_KERNELS
fi

echo "== kernels: go (-tags purego)"
GLMFLASH_EXPECT_KERNELS=go $GO test -count=1 -tags purego ./kernels/... ./internal/cpulimits
GLMFLASH_EXPECT_KERNELS=go $GO test -count=1 -tags purego -run "$PARITY" ./tests
