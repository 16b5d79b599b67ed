package cpu

// SetAfterWeightsCheck sets the hook run between a batch's weights check
// and its kernels (nil: none).
func SetAfterWeightsCheck(f func()) { afterWeightsCheck = f }
