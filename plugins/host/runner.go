package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin/runner"
)

// groupRunner runs a plugin command for go-plugin (ClientConfig.RunnerFunc)
// as go-plugin's own runner does, with two differences: it reports the
// process id the moment the process exists (so that a shutdown during the
// handshake can kill it), and Kill kills the plugin's whole process group,
// children included (a wrapper script's child would otherwise keep the
// output pipes open, and go-plugin would wait on them for ever).
type groupRunner struct {
	cmd            *exec.Cmd
	stdout, stderr io.ReadCloser
	started        func(pid int)
	pid            int
	tail           tailBuffer    // the end of the plugin's stderr
	exited         chan struct{} // closed once Wait returned
	exitOnce       sync.Once
	waitErr        atomic.Pointer[error]
}

// tailBuffer keeps the last tailBytes written to it.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

const tailBytes = 2048

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > tailBytes {
		t.b = append(t.b[:0], t.b[len(t.b)-tailBytes:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// teeReadCloser is stderr read by go-plugin, copied into the tail.
type teeReadCloser struct {
	io.Reader
	io.Closer
}

var _ runner.Runner = (*groupRunner)(nil)

func newGroupRunner(cmd *exec.Cmd, started func(pid int)) (*groupRunner, error) {
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	r := &groupRunner{cmd: cmd, stdout: stdout, started: started, exited: make(chan struct{})}
	r.stderr = teeReadCloser{io.TeeReader(stderr, &r.tail), stderr}
	return r, nil
}

// Start starts the process from a goroutine locked to its OS thread until
// the process is waited for: the parent-death signal (Pdeathsig) fires
// when the thread that forked exits, and a thread of the Go runtime can
// exit under a plugin still running (one whose goroutine ends locked).
func (r *groupRunner) Start(context.Context) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := r.cmd.Start()
		errc <- err
		if err == nil {
			<-r.exited
		}
		runtime.UnlockOSThread()
	}()
	if err := <-errc; err != nil {
		return err
	}
	r.pid = r.cmd.Process.Pid
	r.started(r.pid)
	return nil
}

func (r *groupRunner) Wait(context.Context) error {
	err := r.cmd.Wait()
	r.waitErr.Store(&err)
	r.exitOnce.Do(func() { close(r.exited) })
	return err
}

// stderrTail is the end of what the plugin wrote on stderr.
func (r *groupRunner) stderrTail() string { return r.tail.String() }

// exitStatus says how the plugin ended ("" while it runs or was not
// waited for within wait).
func (r *groupRunner) exitStatus(wait time.Duration) string {
	select {
	case <-r.exited:
	case <-time.After(wait):
		return ""
	}
	if st := r.cmd.ProcessState; st != nil {
		return "exited: " + st.String()
	}
	return ""
}

func (r *groupRunner) Kill(context.Context) error {
	if r.cmd.Process == nil {
		return nil
	}
	killGroup(r.pid)
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (r *groupRunner) Stdout() io.ReadCloser { return r.stdout }
func (r *groupRunner) Stderr() io.ReadCloser { return r.stderr }
func (r *groupRunner) Name() string          { return r.cmd.Args[0] }
func (r *groupRunner) ID() string            { return fmt.Sprint(r.pid) }

// Diagnose explains a handshake line go-plugin could not read. A plugin
// that exited is not blamed on the SDK: the launch error then carries its
// exit status and stderr (Plugin.startNotes).
func (r *groupRunner) Diagnose(context.Context) string {
	if r.exitStatus(time.Second) != "" {
		return ""
	}
	return "the plugin did not answer go-plugin's handshake: is it built with plugins/sdk (sdk.Serve)?"
}

func (r *groupRunner) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (r *groupRunner) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }

// runnerFunc returns go-plugin's RunnerFunc for the plugin's verified
// command: go-plugin's spec carries the environment (handshake, TLS
// certificate) the command gets.
func (p *Plugin) runnerFunc(own *exec.Cmd) func(hclog.Logger, *exec.Cmd, string) (runner.Runner, error) {
	return func(_ hclog.Logger, spec *exec.Cmd, _ string) (runner.Runner, error) {
		own.Env, own.Stdin = append(spec.Env, own.Env...), spec.Stdin
		return p.newRunner(own)
	}
}

func (p *Plugin) newRunner(cmd *exec.Cmd) (runner.Runner, error) {
	r, err := newGroupRunner(cmd, func(pid int) {
		live.Lock()
		p.pid = pid
		live.m[p] = pid
		live.Unlock()
	})
	if err == nil {
		p.runner = r
	}
	return r, err
}
