//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package attrib

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes an exclusive flock(2) on path (created if missing) without
// waiting; errBusy when another process holds it. The kernel releases the
// lock when its holder dies, so a killed study leaves no stale lock. A file
// unlinked (by its releasing holder) between the open and the lock is
// retried, so two studies cannot hold locks on two files of one path.
func lockFile(path string) (*os.File, error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, errBusy
			}
			return nil, err
		}
		fi, err1 := f.Stat()
		pi, err2 := os.Stat(path)
		if err1 == nil && err2 == nil && os.SameFile(fi, pi) {
			return f, nil
		}
		f.Close() // unlinked meanwhile: lock the file now at path
	}
}
