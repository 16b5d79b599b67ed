package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/glmflash/glmflash/internal/proctree"
	"github.com/stretchr/testify/require"
)

// fakeServe writes a script that plays glmflash serve: it leaves a child
// behind (sleep), prints serve's banner with the given API address, and
// waits; onTerm is its SIGTERM trap.
func fakeServe(t *testing.T, api, onTerm string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fake-serve")
	script := "#!/bin/sh\ntrap '" + onTerm + "' TERM\nsleep 300 &\n" +
		"echo 'The OpenAI-compatible API is on " + api + "/v1 (model \"fake\")'\n" +
		"while :; do wait; done\n"
	require.NoError(t, os.WriteFile(p, []byte(script), 0o755))
	return p
}

// The started server is stopped with SIGTERM, or SIGKILL when it does not
// stop in time; either way nothing it started is left running.
func TestServedStopLeavesNoProcess(t *testing.T) {
	health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"status":"ok"}`))
	}))
	defer health.Close()
	for name, c := range map[string]struct {
		trap string
		want string
	}{
		"drains on SIGTERM": {"exit 0", ""},
		"ignores SIGTERM":   {"", "did not stop within 1s of SIGTERM: killed"},
	} {
		t.Run(name, func(t *testing.T) {
			s := &serveSpec{binary: fakeServe(t, health.URL, c.trap), startTimeout: 20 * time.Second, stopTimeout: time.Second}
			srv, err := s.start(context.Background())
			require.NoError(t, err)
			require.Equal(t, health.URL, srv.baseURL)
			require.Equal(t, "fake", srv.model)
			var left []proctree.Proc
			require.Eventually(t, func() bool {
				left = proctree.Descendants(srv.cmd.Process.Pid)
				return len(left) > 0
			}, 10*time.Second, 10*time.Millisecond, "the script's sleep")
			err = srv.stop()
			if c.want == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, c.want)
			}
			for _, p := range left {
				require.Eventually(t, func() bool { return !proctree.Alive(p) }, 10*time.Second, 10*time.Millisecond, "pid %d left behind", p.PID)
			}
			require.Equal(t, err, srv.stop(), "stopped once")
		})
	}
}

// A server that exits before serving fails the start with its log; one
// whose /health never answers fails it at --serve-timeout.
func TestServedStartFailures(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dies")
	require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\necho 'config: unknown key \"x\"' >&2\nexit 3\n"), 0o755))
	_, err := (&serveSpec{binary: p, startTimeout: 20 * time.Second, stopTimeout: time.Second}).start(context.Background())
	require.ErrorContains(t, err, "--serve: the server exited before serving (exit status 3); its log ends:\nconfig: unknown key \"x\"")

	dead := httptest.NewServer(http.NotFoundHandler())
	defer dead.Close()
	_, err = (&serveSpec{binary: fakeServe(t, dead.URL, "exit 0"), startTimeout: time.Second, stopTimeout: time.Second}).start(context.Background())
	require.ErrorContains(t, err, "--serve: /health did not answer 200 within --serve-timeout 1s")
}
