package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/glmflash/glmflash/internal/syncbuf"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestServeRejectsBadConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "serve.yaml")
	require.NoError(t, os.WriteFile(p, []byte("model: {preset: tiny}\nserver: {grpc_port: 1}\n"), 0o644))
	_, err := runCLI(t, "serve", "--config", p)
	require.ErrorContains(t, err, `unknown key "server.grpc_port"`)
}

// The command serves, prints how to call it, and drains on SIGTERM: a
// stream still running at the drain deadline ends with ABORT.
func TestServeCommandAndSIGTERM(t *testing.T) {
	p := filepath.Join(t.TempDir(), "serve.yaml")
	abs, err := filepath.Abs(fixture + "/checkpoint")
	require.NoError(t, err)
	cfg := "model: {dir: " + abs + "}\nserver: {grpc_addr: \"127.0.0.1:0\", http_addr: \"127.0.0.1:0\", metrics_addr: \"\", drain_timeout: 300ms}\nruntime: {slots: 2}\n"
	require.NoError(t, os.WriteFile(p, []byte(cfg), 0o644))
	root := newRoot()
	out := &syncbuf.Buffer{}
	root.SetOut(out)
	root.SetArgs([]string{"--log-level", "warn", "serve", "--config", p})
	done := make(chan error, 1)
	go func() { done <- root.Execute() }()

	re := regexp.MustCompile(`serving glmflash.v1.GLMFlash on (127\.0\.0\.1:\d+)`)
	var addr string
	require.Eventually(t, func() bool {
		m := re.FindStringSubmatch(out.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	}, 30*time.Second, 10*time.Millisecond)
	require.Contains(t, out.String(), "bin/grpcurl -plaintext -d ")

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	c := pb.NewGLMFlashClient(conn)
	zero, four := 0.0, uint32(4000)
	st, err := c.Generate(context.Background(), &pb.GenerateRequest{PromptIds: []int32{1, 2, 3}, MaxTokens: &four, Sampling: &pb.SamplingParams{Temperature: &zero}})
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)

	require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGTERM))
	var fin *pb.Finish
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if f := m.GetFinish(); f != nil {
			fin = f
		}
	}
	require.NotNil(t, fin)
	require.Equal(t, pb.FinishReason_FINISH_REASON_ABORT, fin.Reason)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop after SIGTERM")
	}
}
