#!/bin/sh
# Compiles kernels/cuda/src/all.cu to the committed PTX (sm_90 and the
# portable compute_75), each file headed by the SHA-256 of the sources
# (name, newline, contents of every *.cu/*.cuh in byte order of names) and
# the nvcc version. Needs nvcc (the GPU machine has it); `make ptx` calls
# this. OUT_DIR (default kernels/cuda/ptx) says where the files go.
set -eu
NVCC=${NVCC:-nvcc}
SRC=kernels/cuda/src
OUT_DIR=${OUT_DIR:-kernels/cuda/ptx}
command -v "$NVCC" >/dev/null || { echo "ptx.sh: nvcc not found (the CUDA toolkit); run it on the GPU machine" >&2; exit 1; }
h=$(cd "$SRC" && for f in $(ls | grep -E '\.cuh?$' | LC_ALL=C sort); do printf '%s\n' "$f"; cat "$f"; done | sha256sum | cut -d' ' -f1)
v=$("$NVCC" --version | tail -1)
mkdir -p "$OUT_DIR"
for t in sm_90 compute_75; do
	"$NVCC" -ptx -O3 -arch=$t -o "$OUT_DIR/glmflash.$t.ptx.tmp" "$SRC/all.cu"
	{ echo "// glmflash-sources-sha256: $h"; echo "// $v"; cat "$OUT_DIR/glmflash.$t.ptx.tmp"; } > "$OUT_DIR/glmflash.$t.ptx"
	rm -f "$OUT_DIR/glmflash.$t.ptx.tmp"
	echo "$OUT_DIR/glmflash.$t.ptx ($v, sources $h)"
done
