// Package regular reads files that come from users (configurations,
// checkpoints, studies) safely: only regular files, opened without blocking
// (a FIFO or a device is refused, never waited on), and read up to a limit
// (a link to /dev/zero or a huge file is an error, not an allocation).
package regular

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// Common limits of the files glmflash reads whole.
const (
	// ConfigLimit bounds a JSON or YAML configuration file (16 MiB).
	ConfigLimit = 16 << 20
)

// Open opens path for reading if it is a regular file (links are followed).
// It never blocks: the file is opened non-blocking, then checked on the
// descriptor, so a FIFO, socket or device is refused.
func Open(path string) (*os.File, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s: not a regular file (%s)", path, kind(st.Mode()))
	}
	return f, st, nil
}

func kind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return m.Type().String()
}

// ErrTooLarge is wrapped by ReadFile's error for a file over its limit.
var ErrTooLarge = errors.New("file too large")

// ReadFile reads a whole regular file of at most limit bytes.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, st, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st.Size() > limit {
		return nil, fmt.Errorf("%s: %w: %d bytes, more than the %d byte limit", path, ErrTooLarge, st.Size(), limit)
	}
	// the size may change after the stat: read at most limit+1 bytes
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: %w: more than the %d byte limit", path, ErrTooLarge, limit)
	}
	return b, nil
}
