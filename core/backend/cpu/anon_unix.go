//go:build unix

package cpu

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// allocBF16 returns n zeroed bf16 values in an anonymous private mapping:
// off the Go heap, so a large weight copy neither counts toward the
// garbage collector's heap goal (which would let the heap grow to twice
// the weights before a collection) nor is scanned. Free it with freeBF16;
// sealBF16 makes it read-only once filled.
func allocBF16(n int) ([]uint16, error) {
	if n == 0 {
		return nil, nil
	}
	b, err := unix.Mmap(-1, 0, 2*n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), n), nil
}

// sealBF16 makes a filled allocBF16 slice read-only (a stray write faults).
func sealBF16(w []uint16) error {
	if len(w) == 0 {
		return nil
	}
	return unix.Mprotect(bf16Bytes(w), unix.PROT_READ)
}

// freeBF16 unmaps an allocBF16 slice.
func freeBF16(w []uint16) error {
	if len(w) == 0 {
		return nil
	}
	return unix.Munmap(bf16Bytes(w))
}

func bf16Bytes(w []uint16) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), 2*len(w))
}
