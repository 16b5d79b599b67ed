//go:build unix

package safetensors

import (
	"os"

	"golang.org/x/sys/unix"
)

func mmapFile(f *os.File, size int64) ([]byte, error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, errNoMmap
	}
	return unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
}

func munmap(b []byte) error { return unix.Munmap(b) }

// dropPages tells the kernel the mapped pages of b are not needed now: they
// leave the resident set and are read again from the file (page cache) when
// next touched. Only for read-only file mappings.
func dropPages(b []byte) error { return unix.Madvise(b, unix.MADV_DONTNEED) }
