//go:build linux

package proctree

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A shell's children, one of them in a session of its own (setsid), are
// its descendants; Kill ends them and leaves a reused-looking entry alone.
func TestDescendantsAndKill(t *testing.T) {
	cmd := exec.Command("sh", "-c", "setsid sleep 60 & sleep 60 & echo ready; wait")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	buf := make([]byte, 6)
	_, err = out.Read(buf)
	require.NoError(t, err)
	var ds []Proc
	for i := 0; i < 100 && len(ds) < 2; i++ {
		ds = Descendants(cmd.Process.Pid)
		time.Sleep(20 * time.Millisecond)
	}
	require.Len(t, ds, 2, "%v", ds)
	for _, d := range ds {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(d.PID) + "/cmdline")
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(string(b), "sleep") || strings.HasPrefix(string(b), "setsid"), "%q", b)
		require.True(t, Alive(d))
	}
	require.Equal(t, 0, Kill([]Proc{{PID: ds[0].PID, Start: ds[0].Start + 1}}), "another start time: not the same process")
	require.Equal(t, 2, Kill(ds))
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	_ = cmd.Wait()
	for _, d := range ds {
		for i := 0; i < 100 && Alive(d); i++ {
			time.Sleep(20 * time.Millisecond)
		}
		require.False(t, Alive(d))
	}
	require.Empty(t, Descendants(1<<30))
}
