#!/bin/sh
# Runs the CUDA tests from test binaries built by `make gpu-test-bins`
# (bin/gpu-tests/*.test), so that a machine with a GPU but no Go can run
# them: kernel tests against the CPU kernels, the backend's unit tests, and
# the model tests (transformers parity on the GPU, CPU agreement, batching
# invariance, length syncs). GLMFLASH_REQUIRE_GPU makes a missing GPU a
# failure instead of a skip. Extra arguments go to every test binary.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
bins="$root/bin/gpu-tests"
[ -d "$bins" ] || { echo "test-gpu: no $bins (make gpu-test-bins builds it)" >&2; exit 1; }
export GLMFLASH_REQUIRE_GPU=${GLMFLASH_REQUIRE_GPU-1}
status=0
for pkg in kernels/cuda core/backend/cuda tests/gpu; do
	bin="$bins/$(echo "$pkg" | tr / _).test"
	echo "== $pkg"
	(cd "$root/$pkg" && "$bin" -test.count=1 -test.timeout=30m -test.v -test.run "${GPU_TEST_RUN:-.}" "$@") || status=1
done
exit $status
