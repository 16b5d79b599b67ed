package cuda

// MHCMixGrid is glmf_mhc_mix's grid for T tokens: a block per token that
// collapses its streams into h and, beside it, one that computes its post
// gates and Sinkhorn-projected comb (MHC_THREADS = 256 threads each).
func MHCMixGrid(T int) Dim3 { return Dim3{X: uint32(T), Y: 2} }
