package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"

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
	return &groupRunner{cmd: cmd, stdout: stdout, stderr: stderr, started: started}, nil
}

func (r *groupRunner) Start(context.Context) error {
	if err := r.cmd.Start(); err != nil {
		return err
	}
	r.pid = r.cmd.Process.Pid
	r.started(r.pid)
	return nil
}

func (r *groupRunner) Wait(context.Context) error { return r.cmd.Wait() }

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

func (r *groupRunner) Diagnose(context.Context) string {
	return "the plugin did not answer go-plugin's handshake: is it built with plugins/sdk (sdk.Serve)?"
}

func (r *groupRunner) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (r *groupRunner) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }

// runnerFunc returns go-plugin's RunnerFunc for the plugin's verified
// command: go-plugin's spec carries the environment (handshake, TLS
// certificate) the command gets.
func (p *Plugin) runnerFunc(own *exec.Cmd) func(hclog.Logger, *exec.Cmd, string) (runner.Runner, error) {
	return func(_ hclog.Logger, spec *exec.Cmd, _ string) (runner.Runner, error) {
		own.Env, own.Stdin = spec.Env, spec.Stdin
		return p.newRunner(own)
	}
}

func (p *Plugin) newRunner(cmd *exec.Cmd) (runner.Runner, error) {
	return newGroupRunner(cmd, func(pid int) {
		live.Lock()
		p.pid = pid
		live.m[p] = pid
		live.Unlock()
	})
}
