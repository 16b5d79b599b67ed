// The one translation unit compiled to PTX: every kernel family.
#include "dense.cu"
#include "gemm.cu"
#include "mhc.cu"
#include "kda.cu"
#include "dsa.cu"
#include "moe.cu"
#include "moe_mma.cu"
#include "sample.cu"
