package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/loadgen"
	"github.com/glmflash/glmflash/internal/proctree"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/spf13/cobra"
)

// serveSpec is bench serve's --serve: glmflash serve started as a child
// process with a configuration (--config files, --preset, --device,
// --load-format and --set as serve takes them, --serve-set KEY=VALUE for any
// other key), its listeners on loopback ports of the system's choosing.
type serveSpec struct {
	on           bool
	mf           modelFlags // --config, --device, --load-format, --set: serve's own flags
	preset       string
	serveSet     []string
	startTimeout time.Duration
	stopTimeout  time.Duration
	logPath      string
	binary       string   // the executable run (this one unless a test says otherwise)
	env          []string // KEY=VALUE environment variables of the child (--serve-set, the listeners)
	args         []string // serve's flags of the child
	cfg          *config.Config
}

// serveFlagNames are --serve's flags (refused without it).
var serveFlagNames = []string{"config", "preset", "device", "load-format", "set", "serve-set", "serve-timeout", "serve-log"}

func (s *serveSpec) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&s.on, "serve", false, "start glmflash serve (this binary) with --config/--preset/--device/--load-format/--set/--serve-set on loopback ports, wait for /health, run, then stop it (SIGTERM, then SIGKILL of its process tree)")
	s.mf.addConfig(cmd)
	s.mf.addDevice(cmd)
	s.mf.addLoad(cmd, false)
	fl.StringVar(&s.preset, "preset", "", "--serve: serve a random checkpoint of this preset ("+strings.Join(randckpt.PresetNames(), ", ")+"; model.preset)")
	fl.StringArrayVar(&s.serveSet, "serve-set", nil, "--serve: any configuration key of the server, KEY=VALUE (repeatable; e.g. --serve-set runtime.slots=16 --serve-set model.dir=DIR), over the --config files")
	fl.DurationVar(&s.startTimeout, "serve-timeout", 10*time.Minute, "--serve: how long the server may take to load and answer /health")
	fl.StringVar(&s.logPath, "serve-log", "", "--serve: write the server's log (stderr) to this file (default: kept in memory, its end shown when the server fails)")
}

// listenerKeys are the keys --serve sets unless --serve-set does: loopback
// listeners on free ports, no metrics port of its own.
var listenerKeys = []config.Flag{
	{Key: "server.grpc_addr", Value: "127.0.0.1:0", Name: "--serve"},
	{Key: "server.http_addr", Value: "127.0.0.1:0", Name: "--serve"},
	{Key: "server.metrics_addr", Value: "", Name: "--serve"},
}

// check refuses --serve's flags without --serve and validates the
// server's configuration in this process (errors name the key and where
// it came from) before anything starts.
func (s *serveSpec) check(f *benchServeFlags) error {
	if !s.on {
		for _, n := range serveFlagNames {
			if f.set(n) {
				return fmt.Errorf("--%s applies to --serve (the server bench serve starts), which is not given", n)
			}
		}
		return nil
	}
	if f.set("base-url") {
		return fmt.Errorf("--base-url and --serve are mutually exclusive: --serve benchmarks the server it starts")
	}
	if s.startTimeout <= 0 {
		return fmt.Errorf("--serve-timeout must be > 0, got %s", s.startTimeout)
	}
	s.stopTimeout = 60 * time.Second
	var keys []config.Flag
	given := map[string]bool{}
	for _, kv := range s.serveSet {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t=") || strings.Contains(k, "__") {
			return fmt.Errorf("--serve-set %q: want KEY=VALUE (a configuration key path such as runtime.slots)", kv)
		}
		for flag, key := range map[string]string{"--device": "device", "--preset": "model.preset", "--load-format": "model.load_format", "--set": "model.set"} {
			if k == key || strings.HasPrefix(k, key+".") {
				return fmt.Errorf("--serve-set %s: use %s", k, flag)
			}
		}
		keys = append(keys, config.Flag{Key: k, Value: v, Name: "--serve-set " + k})
		given[k] = true
	}
	for _, l := range listenerKeys {
		if !given[l.Key] {
			keys = append(keys, l)
		}
	}
	s.args = nil
	for _, c := range s.mf.files {
		s.args = append(s.args, "--config", c)
	}
	if f.set("preset") {
		keys = append(keys, config.Flag{Key: "model.preset", Value: s.preset, Name: "--preset"})
		s.args = append(s.args, "--preset", s.preset)
	}
	if f.set("device") {
		s.args = append(s.args, "--device", s.mf.device)
	}
	if f.set("load-format") {
		s.args = append(s.args, "--load-format", s.mf.loadFormat)
	}
	for _, kv := range s.mf.set {
		s.args = append(s.args, "--set", kv)
	}
	s.env = nil
	for _, k := range keys {
		if k.Key != "model.preset" {
			s.env = append(s.env, fmt.Sprintf("%s=%v", envName(k.Key), k.Value))
		}
	}
	s.mf.extra = keys
	cfg, err := s.mf.config()
	if err != nil {
		return fmt.Errorf("--serve: %w", err)
	}
	switch {
	case cfg.Server.HTTPAddr == "":
		return fmt.Errorf("--serve: server.http_addr is empty (%s): bench serve needs the HTTP API", cfg.Sources.Of("server.http_addr"))
	case cfg.Server.TLS.Enabled():
		return fmt.Errorf("--serve: server.tls is on: bench serve's client speaks plain HTTP to the server it starts (start it yourself and point --base-url at it)")
	case cfg.Server.Auth.APIKeysFile != "" && !f.set("api-key") && os.Getenv("OPENAI_API_KEY") == "":
		return fmt.Errorf("--serve: server.auth.api_keys_file is set (%s): give one of its keys with --api-key (or $OPENAI_API_KEY)", cfg.Sources.Of("server.auth.api_keys_file"))
	}
	if f.metricsURL != "off" && !cfg.Server.HTTPMetrics {
		log.Warn().Msg("--serve: server.http_metrics is off: the server's metrics are not read")
		f.metricsURL = "off"
	}
	s.cfg = cfg
	return nil
}

// served is a started glmflash serve.
type served struct {
	cmd         *exec.Cmd
	baseURL     string
	model       string
	description string
	done        chan struct{} // closed when the process has exited
	exitErr     error         // its Wait's error, once done
	log         *tailWriter
	logFile     *os.File
	stopTimeout time.Duration
	proc        proctree.Proc // the process, with its start time (a reused id is not it)
	stopOnce    sync.Once
	stopErr     error
}

// apiRE finds the HTTP API's address in serve's banner (httpBanner).
var apiRE = regexp.MustCompile(`The OpenAI-compatible API is on (https?://\S+)/v1 \(model "((?:[^"\\]|\\.)*)"\)`)

// envName is the environment variable of a configuration key
// (config.EnvPrefix: levels joined by "__").
func envName(key string) string {
	return config.EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "__"))
}

// start runs the server: this binary's serve with the --config files and
// every other key as its environment variable (the layer above the files,
// as --set is here), in a process group of its own that gets SIGTERM if
// this process dies; it returns once /health answers.
func (s *serveSpec) start(ctx context.Context) (*served, error) {
	bin := s.binary
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("--serve: %w", err)
		}
		bin = self
	}
	_ = proctree.SetSubreaper() // a grandchild whose parent dies stays ours to find and kill (best effort)
	argv := append([]string{"--log-format", "json", "--log-level", "info", "serve"}, s.args...)
	env := os.Environ()
	var desc []string
	for _, kv := range s.env {
		name, _, _ := strings.Cut(kv, "=")
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, name+"=") })
		env = append(env, kv)
	}
	for _, kv := range s.serveSet {
		desc = append(desc, "--serve-set "+kv)
	}
	cmd := exec.Command(bin, argv...)
	cmd.Env = env
	cmd.SysProcAttr = childAttrs()
	// A process the server leaves behind may hold its stdout or stderr open:
	// Wait then gives up on them this long after the server exited.
	cmd.WaitDelay = 2 * time.Second
	srv := &served{cmd: cmd, done: make(chan struct{}), log: &tailWriter{max: 64 << 10}, stopTimeout: s.stopTimeout}
	srv.description = strings.TrimSpace("glmflash serve " + strings.Join(append(append([]string{}, s.args...), desc...), " "))
	var stderr io.Writer = srv.log
	if s.logPath != "" {
		lf, err := os.Create(s.logPath)
		if err != nil {
			return nil, fmt.Errorf("--serve-log: %w", err)
		}
		srv.logFile = lf
		stderr = io.MultiWriter(srv.log, lf)
	}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// Started from a goroutine locked to its thread for the child's life:
	// the parent-death signal fires when the starting thread exits.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(srv.done)
			return
		}
		started <- nil
		srv.exitErr = cmd.Wait()
		close(srv.done)
	}()
	if err := <-started; err != nil {
		srv.closeLog()
		return nil, fmt.Errorf("--serve: starting %s serve: %w", bin, err)
	}
	for _, p := range proctree.Descendants(os.Getpid()) {
		if p.PID == cmd.Process.Pid {
			srv.proc = p
		}
	}
	log.Info().Int("pid", cmd.Process.Pid).Str("config", srv.description).Msg("--serve: glmflash serve started")
	found := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if m := apiRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout) // drained until the server exits
	}()
	deadline := time.NewTimer(s.startTimeout)
	defer deadline.Stop()
	fail := func(err error) (*served, error) {
		select {
		case <-srv.done: // it exited: its log is in err
			srv.closeLog()
			return nil, err
		default:
		}
		if serr := srv.stop(); serr != nil {
			err = fmt.Errorf("%w (and stopping it: %v)", err, serr)
		}
		return nil, err
	}
	var m []string
	select {
	case m = <-found:
	case <-srv.done:
		return fail(fmt.Errorf("--serve: the server exited before serving (%v); its log ends:\n%s", srv.exitErr, srv.log.String()))
	case <-deadline.C:
		return fail(fmt.Errorf("--serve: the server did not serve within --serve-timeout %s; its log ends:\n%s", s.startTimeout, srv.log.String()))
	case <-ctx.Done():
		return fail(fmt.Errorf("--serve: interrupted while the server started"))
	}
	srv.baseURL, srv.model = m[1], strings.ReplaceAll(m[2], `\"`, `"`)
	c := loadgen.NewClient(srv.baseURL, "", 1)
	defer c.CloseIdle()
	for {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.Health(hctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-srv.done:
			return fail(fmt.Errorf("--serve: the server exited before /health answered (%v); its log ends:\n%s", srv.exitErr, srv.log.String()))
		case <-deadline.C:
			return fail(fmt.Errorf("--serve: /health did not answer 200 within --serve-timeout %s (%v)", s.startTimeout, err))
		case <-ctx.Done():
			return fail(fmt.Errorf("--serve: interrupted while the server started"))
		}
	}
	log.Info().Str("url", srv.baseURL).Str("model", srv.model).Msg("--serve: the server is healthy")
	return srv, nil
}

// stop ends the server: SIGTERM (it drains), then after stopTimeout
// SIGKILL; every process it started (plugin processes) that is still alive
// then is killed too. It reports a server that had exited on its own (it
// failed during the run) or exited with an error.
func (s *served) stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.doStop() })
	return s.stopErr
}

func (s *served) doStop() error {
	defer s.closeLog()
	if s.cmd.Process == nil {
		return nil
	}
	pid := s.cmd.Process.Pid
	select {
	case <-s.done:
		return fmt.Errorf("the server (pid %d) had exited during the run (%v); its log ends:\n%s", pid, s.exitErr, s.log.String())
	default:
	}
	tree := proctree.Descendants(pid) // before the signal: once it exits, its children move
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	// Its exit is seen in /proc (a zombie until Wait reaps it): Wait itself
	// may wait longer, for pipes that processes it left behind hold open.
	deadline := time.Now().Add(s.stopTimeout)
	killed := false
	for s.alive() {
		if time.Now().After(deadline) {
			_ = s.cmd.Process.Kill()
			killed = true
			break
		}
		select {
		case <-s.done:
		case <-time.After(20 * time.Millisecond):
		}
	}
	tree = append(tree, proctree.Descendants(pid)...) // none once it exited; a subreaper keeps its orphans ours
	if n := proctree.Kill(tree); n > 0 {
		log.Warn().Int("processes", n).Msg("--serve: killed processes the server left behind")
	}
	<-s.done
	var err error
	var ee *exec.ExitError
	switch {
	case killed:
		err = fmt.Errorf("the server (pid %d) did not stop within %s of SIGTERM: killed", pid, s.stopTimeout)
	case s.exitErr != nil && !(errors.As(s.exitErr, &ee) && ee.Success()):
		err = fmt.Errorf("the server exited with %v after SIGTERM; its log ends:\n%s", s.exitErr, s.log.String())
	}
	log.Info().Int("pid", pid).Msg("--serve: the server stopped")
	return err
}

// alive reports whether the server's process still runs (not exited, not
// a zombie).
func (s *served) alive() bool {
	select {
	case <-s.done:
		return false
	default:
	}
	return s.proc == (proctree.Proc{}) || proctree.Alive(s.proc)
}

func (s *served) closeLog() {
	if s.logFile != nil {
		s.logFile.Close()
		s.logFile = nil
	}
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.b))
	if s == "" {
		return "(nothing)"
	}
	return s
}
