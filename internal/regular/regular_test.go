package regular

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadFileRefusesWhatIsNotARegularBoundedFile(t *testing.T) {
	d := t.TempDir()
	ok := filepath.Join(d, "ok.json")
	require.NoError(t, os.WriteFile(ok, []byte("{}"), 0o644))
	b, err := ReadFile(ok, 10)
	require.NoError(t, err)
	require.Equal(t, "{}", string(b))

	_, err = ReadFile(ok, 1)
	require.ErrorIs(t, err, ErrTooLarge)

	zero := filepath.Join(d, "zero.json")
	require.NoError(t, os.Symlink("/dev/zero", zero))
	_, err = ReadFile(zero, 1<<20)
	require.ErrorContains(t, err, "not a regular file (a device)")

	fifo := filepath.Join(d, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	_, err = ReadFile(fifo, 1<<20) // no writer: a blocking open would hang here
	require.ErrorContains(t, err, "not a regular file (a FIFO)")

	_, err = ReadFile(d, 1<<20)
	require.ErrorContains(t, err, "a directory")
}
