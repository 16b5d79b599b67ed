package tests

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// A second Ctrl-C (SIGINT) forces serve's exit while it drains a stream
// that would outlive a long drain_timeout: exit status 130, at once. The
// stream's client stops reading (its flow-control window fills with top
// logprobs), so the drain cannot end by itself whatever the machine's speed.
func TestSecondSignalForcesExit(t *testing.T) {
	bin := glmflashBinary(t)
	d := t.TempDir()
	model, err := filepath.Abs(filepath.Join(fixtureDir(fixtures[0]), "checkpoint"))
	require.NoError(t, err)
	sc := filepath.Join(d, "serve.yaml")
	require.NoError(t, os.WriteFile(sc, []byte("model: {dir: "+model+"}\nserver: {grpc_addr: \"127.0.0.1:0\", http_addr: \"127.0.0.1:0\", metrics_addr: \"\", drain_timeout: 10m}\nruntime: {slots: 1}\n"), 0o644))
	cmd := exec.Command(bin, "--log-level", "warn", "serve", "--config", sc, "--config", "configs/presets/baseline.yaml")
	cmd.Dir = ".."
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var errOut syncWriter
	cmd.Stderr = &errOut
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`serving glmflash\.v1\.GLMFlash on (\S+) `)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrc <- m[1]
			}
		}
	}()
	go func() { done <- cmd.Wait() }()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("serve ended: %v: %s", err, errOut.String())
	case <-time.After(hangGuard):
		cmd.Process.Kill()
		t.Fatal("serve did not start")
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	n, zero := uint32(4000), 0.0
	st, err := pb.NewGLMFlashClient(conn).Generate(context.Background(), &pb.GenerateRequest{PromptIds: []int32{1, 2, 3}, MaxTokens: &n, Sampling: &pb.SamplingParams{Temperature: &zero}, TopLogprobs: 20})
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)

	require.NoError(t, cmd.Process.Signal(syscall.SIGINT)) // drains: up to 10 minutes
	require.Eventually(t, func() bool { return regexp.MustCompile(`second Ctrl-C forces`).MatchString(errOut.String()) }, hangGuard, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	select {
	case err := <-done:
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "%v", err)
		require.Equal(t, 130, ee.ExitCode(), errOut.String())
		require.Contains(t, errOut.String(), "second signal: forcing the exit")
	case <-time.After(hangGuard):
		cmd.Process.Kill()
		t.Fatal("a second signal did not force the exit")
	}
}
