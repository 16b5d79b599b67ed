package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/internal/syncbuf"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/spf13/cobra"
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
	require.Contains(t, out.String(), "/v1/chat/completions", "the HTTP API's curl line")

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

// Flags override the environment, which overrides the file.
func TestServeFlagsOverrideEnvironmentAndFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "serve.yaml")
	require.NoError(t, os.WriteFile(p, []byte("model: {dir: ckpt}\nserver: {grpc_addr: \"127.0.0.1:7000\", http_addr: \"127.0.0.1:7001\", metrics_addr: \"\"}\n"), 0o644))
	t.Setenv("GLMFLASH_SERVER__HTTP_ADDR", "127.0.0.1:7100")
	t.Setenv("GLMFLASH_SERVER__GRPC_ADDR", "127.0.0.1:7200")
	load := func(args ...string) (*config.Config, error) {
		cmd := &cobra.Command{}
		var mf modelFlags
		var sf serveFlags
		mf.addConfig(cmd)
		sf.register(cmd)
		require.NoError(t, cmd.ParseFlags(append([]string{"--config", p}, args...)))
		if err := sf.apply(cmd, cmd.Flags().Args(), &mf); err != nil {
			return nil, err
		}
		return mf.config()
	}
	cfg, err := load()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(filepath.Dir(p), "ckpt"), cfg.Model.Dir, "the file's path, relative to the file")
	require.Equal(t, "127.0.0.1:7100", cfg.Server.HTTPAddr, "environment over file")
	require.Equal(t, "127.0.0.1:7200", cfg.Server.GRPCAddr)

	cfg, err = load("--http-port", "7300", "--host", "0.0.0.0", "--preset", "tiny")
	require.NoError(t, err)
	require.Equal(t, "0.0.0.0:7300", cfg.Server.HTTPAddr, "flags over environment")
	require.Equal(t, "0.0.0.0:7200", cfg.Server.GRPCAddr, "--host moves every listener")
	require.Equal(t, "", cfg.Server.MetricsAddr, "a disabled listener stays disabled")
	require.Equal(t, "tiny", cfg.Model.Preset)
	require.Empty(t, cfg.Model.Dir)

	cfg, err = load("/models/m", "--port", "7400")
	require.NoError(t, err)
	require.Equal(t, "/models/m", cfg.Model.Dir)
	require.Equal(t, "127.0.0.1:7400", cfg.Server.GRPCAddr)
	require.Equal(t, "flag --port", cfg.Sources.Of("server.grpc_addr"))
	require.Equal(t, "environment variable GLMFLASH_SERVER__HTTP_ADDR", cfg.Sources.Of("server.http_addr"))

	// --metrics-port moves the metrics listener, and enables it when the
	// configuration disabled it (as --http-port does the API's).
	cfg, err = load("--metrics-port", "7500")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:7500", cfg.Server.MetricsAddr)
	require.Equal(t, "flag --metrics-port", cfg.Sources.Of("server.metrics_addr"))
	cfg, err = load("--metrics-port", "7501", "--host", "0.0.0.0")
	require.NoError(t, err)
	require.Equal(t, "0.0.0.0:7501", cfg.Server.MetricsAddr)

	_, err = load("/models/m", "--preset", "tiny")
	require.ErrorContains(t, err, "mutually exclusive")
	_, err = load("--port", "70000")
	require.ErrorContains(t, err, "--port must be in [0, 65535]")
}

func TestVersion(t *testing.T) {
	root := newRoot()
	out := &syncbuf.Buffer{}
	root.SetOut(out)
	root.SetArgs([]string{"--version"})
	require.NoError(t, root.Execute())
	require.Contains(t, out.String(), "glmflash version ")
	require.Contains(t, out.String(), "go1.")
}

// From any directory, with no configuration file: the built-in defaults,
// flags for the model and the ports, and text over the HTTP API.
func TestServeFromAnyDirectoryWithoutConfig(t *testing.T) {
	t.Chdir(t.TempDir()) // no configs/ here; the preset is written under ./.cache
	t.Setenv("GLMFLASH_SERVER__METRICS_ADDR", "")
	t.Setenv("GLMFLASH_SERVER__DRAIN_TIMEOUT", "300ms")
	root := newRoot()
	out := &syncbuf.Buffer{}
	root.SetOut(out)
	root.SetArgs([]string{"--log-level", "warn", "serve", "--preset", "tiny", "--host", "127.0.0.1", "--port", "0", "--http-port", "0"})
	done := make(chan error, 1)
	go func() { done <- root.Execute() }()
	re := regexp.MustCompile(`API is on http://(127\.0\.0\.1:\d+)/v1 \(model "tiny"\)`)
	var addr string
	require.Eventually(t, func() bool {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	}, 60*time.Second, 10*time.Millisecond)
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"tiny","prompt":"Hello","max_tokens":5,"temperature":0}`))
	require.NoError(t, err)
	var body struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "length", body.Choices[0].FinishReason)
	require.Equal(t, 5, body.Usage.CompletionTokens)
	require.Equal(t, 5, body.Usage.PromptTokens, "the tiny preset's tokenizer is bytes only")

	require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGTERM))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop after SIGTERM")
	}
}
