//go:build !unix

package cpu

// allocBF16 returns n zeroed bf16 values (on the Go heap where anonymous
// mappings are not available).
func allocBF16(n int) ([]uint16, error) { return make([]uint16, n), nil }

// sealBF16 does nothing here.
func sealBF16([]uint16) error { return nil }

// freeBF16 does nothing here: the garbage collector frees the slice.
func freeBF16([]uint16) error { return nil }
