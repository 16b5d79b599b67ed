package cpu

// PoisonDeviceLengths makes the backend's seq_lengths nodes produce wrong
// lengths, so that a test can prove a graph never reads the executor's
// copy (a test hook: production options have none).
func PoisonDeviceLengths(b *Backend) { b.poisonLengths = true }

// SetAfterWeightsCheck sets the hook run between a batch's weights check
// and its kernels (nil: none).
func SetAfterWeightsCheck(f func()) { afterWeightsCheck = f }
