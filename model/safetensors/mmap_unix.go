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

// allocCopy returns size bytes of anonymous private memory (off the Go
// heap: a checkpoint's copy is neither counted toward the collector's goal
// nor scanned) and the function that frees them.
func allocCopy(size int64) ([]byte, func([]byte) error, error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, nil, errNoMmap
	}
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, err
	}
	return b, munmap, nil
}

// sealCopy makes a filled allocCopy region read-only.
func sealCopy(b []byte) error { return unix.Mprotect(b, unix.PROT_READ) }

// identityOf is what Check compares: the file's device, inode, size and
// modification and change times (the change time moves on every write,
// truncation or attribute change, and no one can set it back).
func identityOf(f *os.File) (identity, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return identity{}, err
	}
	return identity{dev: uint64(st.Dev), ino: uint64(st.Ino), size: st.Size,
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, nil
}
