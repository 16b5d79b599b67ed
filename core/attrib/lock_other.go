//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package attrib

import (
	"errors"
	"os"
)

// lockFile creates path exclusively; errBusy when it exists. Without
// flock(2) a study killed before its clean-up leaves the file behind: the
// error says to remove it when no study runs.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrExist) {
		return nil, errBusy
	}
	return f, err
}
