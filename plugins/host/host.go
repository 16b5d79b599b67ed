// Package host runs external pass plugins: it discovers executables named
// glmflash-pass-* in the configured directory, verifies each one's SHA-256
// before running it, starts it with hashicorp/go-plugin (gRPC, AutoMTLS,
// protocol version negotiation), asks it to describe its pass, and makes it
// a pass.Pass that the engine's pipeline runs beside the built-in passes.
//
// Failure policy: a plugin that cannot be verified or started, that crashes,
// hangs past the per-call timeout or returns a graph that does not validate
// makes its pass fail (reported with the reason, logged) and leaves the
// graph as it was; the engine goes on. A plugin that crashed or hung is
// stopped and stays disabled for the life of the host.
package host

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/internal/regular"
	"github.com/glmflash/glmflash/plugins/protocol"
	"github.com/glmflash/glmflash/plugins/wire"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
)

// DefaultTimeout bounds each call to a plugin when plugins.timeout_ms is 0.
const DefaultTimeout = 10 * time.Second

// DefaultStartTimeout bounds a plugin's start (process start and handshake)
// and its Describe call when plugins.start_timeout_ms is 0.
const DefaultStartTimeout = 10 * time.Second

// Bounds of stopping a plugin: a healthy one gets stopGrace to exit by
// itself, then its process group is killed; go-plugin's own clean-up gets
// killWait more, after which it is given up on (and logged).
var (
	stopGrace = 3 * time.Second
	killWait  = 5 * time.Second
)

// afterVerify, when set (by tests), runs between the verification of a
// plugin file and the start of its process: where an attacker would swap it.
var afterVerify func(path string)

// errChecksum is a plugin file whose SHA-256 is not the expected one.
var errChecksum = errors.New("checksum mismatch")

// Options configure a host.
type Options struct {
	// Dir is searched for executables named glmflash-pass-*; empty: no plugins.
	Dir string
	// Checksums maps a plugin file name to its expected hex SHA-256.
	Checksums map[string]string
	// SumsFile is a sidecar in sha256sum format ("<hex>  <file name>").
	SumsFile string
	// AllowUnverified runs plugins that have no expected checksum.
	AllowUnverified bool
	// Timeout bounds every Configure, Eligible and Apply call (default 10 s).
	Timeout time.Duration
	// StartTimeout bounds a plugin's start and Describe (default 10 s).
	StartTimeout time.Duration
	// Log receives the host's messages and the plugins' logs.
	Log zerolog.Logger
	// Versions are the protocol versions offered (default protocol.Versions).
	Versions []int
	// Requested maps pass names listed in the configuration to their
	// options; a plugin that failed to load still accepts these options, so
	// that its failure shows in the pass report instead of as an option error.
	Requested map[string]map[string]any
}

// OptionsFromConfig maps the engine configuration's plugins section.
func OptionsFromConfig(ec *config.Config, log zerolog.Logger) Options {
	o := Options{Dir: ec.Plugins.Dir, Checksums: ec.Plugins.Checksums, SumsFile: ec.Plugins.SumsFile,
		AllowUnverified: ec.Plugins.AllowUnverified, Timeout: time.Duration(ec.Plugins.TimeoutMS) * time.Millisecond,
		StartTimeout: time.Duration(ec.Plugins.StartTimeoutMS) * time.Millisecond,
		Log:          log, Requested: map[string]map[string]any{}}
	for _, p := range ec.Enabled() {
		o.Requested[p.Name] = p.Options
	}
	return o
}

// Host owns the plugin processes.
type Host struct {
	opts    Options
	plugins []*Plugin
	byName  map[string]*Plugin
	ignored []string // why plugins that provide no pass were dropped
}

// Plugin is one discovered plugin executable.
type Plugin struct {
	// File is the executable's name, Path its full path.
	File, Path string
	// Name is the pass name: from Describe, or (when the plugin could not
	// be run) derived from the file name.
	Name string
	// Desc is the pass's description (from Describe).
	Desc pass.Description
	// Version is the negotiated protocol version (0 when not running).
	Version int

	host   *Host
	log    zerolog.Logger
	mu     sync.Mutex // serializes calls
	client *plugin.Client
	rpc    pb.PassPluginClient
	pid    int // the plugin process, leader of its own process group
	runner *groupRunner
	life   *os.File // the write end of the plugin's lifeline pipe
	failed error    // sticky: why the plugin cannot be used
	done   bool     // stopped
	// starting is set from process start to the end of Describe.
	starting atomic.Bool
}

// live lists the plugins whose process may run, for KillAll.
var live = struct {
	sync.Mutex
	m map[*Plugin]int
}{m: map[*Plugin]int{}}

// KillStarting kills the process group of every plugin still starting
// (process start, handshake or Describe), so that Open returns at once: a
// shutdown asked for during start-up does not wait for a hung plugin.
func KillStarting() {
	live.Lock()
	defer live.Unlock()
	for p, pgid := range live.m {
		if p.starting.Load() {
			killGroup(pgid)
		}
	}
}

// KillAll kills the process group of every plugin any host started and has
// not stopped yet: the last resort of a forced exit (a second Ctrl-C), when
// there is no time to stop them one by one.
func KillAll() {
	live.Lock()
	defer live.Unlock()
	for p, pgid := range live.m {
		killGroup(pgid)
		delete(live.m, p)
	}
}

// Open discovers, verifies and starts the plugins of opts.Dir. Errors are
// for the configuration only (an unreadable directory or sums file); a
// plugin that fails is recorded as failed, logged, and its pass reports it.
func Open(opts Options) (*Host, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if len(opts.Versions) == 0 {
		opts.Versions = protocol.Versions
	}
	h := &Host{opts: opts, byName: map[string]*Plugin{}}
	if opts.Dir == "" {
		return h, nil
	}
	sums, err := expectedSums(opts)
	if err != nil {
		return nil, err
	}
	files, skipped, err := discover(opts.Dir)
	if err != nil {
		return nil, err
	}
	for _, s := range skipped {
		opts.Log.Error().Str("plugin", s.file).Msg(s.why + ": not loaded")
		h.ignored = append(h.ignored, s.file+": "+s.why)
	}
	for _, f := range files {
		p := &Plugin{File: f, Path: filepath.Join(opts.Dir, f), Name: strings.TrimPrefix(f, protocol.FilePrefix), host: h,
			log: opts.Log.With().Str("plugin", f).Logger()}
		sum, ok := sums[f]
		switch {
		case ok:
			p.start(sum)
		case opts.AllowUnverified:
			p.log.Warn().Msg("running an unverified plugin (plugins.allow_unverified is on)")
			p.start(nil)
		default:
			p.failed = fmt.Errorf("no expected SHA-256 for %s in plugins.checksums or plugins.sums_file: refusing to run it (set plugins.allow_unverified: true to run unverified plugins)", f)
		}
		if p.failed != nil {
			p.log.Error().Str("pass", p.Name).Err(p.failed).Msg("plugin not loaded")
		}
		if _, builtin := pass.Lookup(p.Name); builtin {
			err := fmt.Errorf("plugin %s describes pass %q, which is a built-in pass: ignored", f, p.Name)
			p.log.Error().Err(err).Msg("plugin not loaded")
			p.stop()
			h.ignored = append(h.ignored, err.Error())
			continue
		}
		if other, dup := h.byName[p.Name]; dup {
			err := fmt.Errorf("plugins %s and %s both provide pass %q: %s ignored", other.File, f, p.Name, f)
			p.log.Error().Err(err).Msg("plugin not loaded")
			p.stop()
			h.ignored = append(h.ignored, err.Error())
			continue
		}
		h.byName[p.Name] = p
		h.plugins = append(h.plugins, p)
	}
	return h, nil
}

// skippedFile is a file named like a plugin that cannot be one.
type skippedFile struct{ file, why string }

// discover lists the plugin executables of dir, sorted, and the files named
// like plugins that are not (with why).
func discover(dir string) ([]string, []skippedFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("plugins.dir: %w", err)
	}
	var out []string
	var skipped []skippedFile
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), protocol.FilePrefix) || len(e.Name()) == len(protocol.FilePrefix) {
			continue
		}
		info, err := os.Stat(filepath.Join(dir, e.Name()))
		switch {
		case err != nil:
			skipped = append(skipped, skippedFile{e.Name(), err.Error()})
		case !info.Mode().IsRegular():
			skipped = append(skipped, skippedFile{e.Name(), "not a regular file"})
		case info.Mode().Perm()&0o111 == 0:
			skipped = append(skipped, skippedFile{e.Name(), fmt.Sprintf("not executable (mode %v)", info.Mode().Perm())})
		default:
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, skipped, nil
}

// expectedSums merges plugins.checksums and the sums file.
func expectedSums(opts Options) (map[string][]byte, error) {
	out := map[string][]byte{}
	add := func(name, hexSum, where string) error {
		b, err := hex.DecodeString(hexSum)
		if err != nil || len(b) != sha256.Size {
			return fmt.Errorf("%s: %q is not a hex SHA-256", where, hexSum)
		}
		if prev, ok := out[name]; ok && !equalBytes(prev, b) {
			return fmt.Errorf("%s: %s has two different expected checksums", where, name)
		}
		out[name] = b
		return nil
	}
	for name, s := range opts.Checksums {
		if err := add(name, s, "plugins.checksums."+name); err != nil {
			return nil, err
		}
	}
	if opts.SumsFile != "" {
		f, _, err := regular.Open(opts.SumsFile)
		if err != nil {
			return nil, fmt.Errorf("plugins.sums_file: %w", err)
		}
		defer f.Close()
		sc := bufio.NewScanner(io.LimitReader(f, regular.ConfigLimit)) // bounded, like every config file
		for ln := 1; sc.Scan(); ln++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			sum, name, ok := strings.Cut(line, " ")
			name = strings.TrimPrefix(strings.TrimLeft(name, " "), "*") // "*" marks binary mode
			if !ok || name == "" {
				return nil, fmt.Errorf("plugins.sums_file %s:%d: want \"<sha256>  <file name>\"", opts.SumsFile, ln)
			}
			if err := add(filepath.Base(name), sum, fmt.Sprintf("plugins.sums_file %s:%d", opts.SumsFile, ln)); err != nil {
				return nil, err
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("plugins.sums_file: %w", err)
		}
	}
	return out, nil
}

func equalBytes(a, b []byte) bool { return hex.EncodeToString(a) == hex.EncodeToString(b) }

// start runs the plugin (sum nil: unverified) and asks for its description.
// The bytes it runs are the bytes it verified (verifiedCommand).
func (p *Plugin) start(sum []byte) {
	p.starting.Store(true)
	defer p.starting.Store(false)
	var cc plugin.ClientProtocol
	for attempt := 1; ; attempt++ {
		var err error
		cc, err = p.launch(sum)
		if err == nil {
			break
		}
		if p.failed == nil {
			p.failed = err
		}
		p.stop()
		// a fork elsewhere in this process may briefly hold the copy open
		// for writing (ETXTBSY); a new copy and a new start fix it
		if attempt < 3 && strings.Contains(err.Error(), "text file busy") {
			p.done, p.failed, p.client, p.pid = false, nil, nil, 0
			continue
		}
		return
	}
	p.Version = p.client.NegotiatedVersion()
	raw, err := cc.Dispense(protocol.PluginName)
	if err != nil {
		p.failed = fmt.Errorf("could not dispense the pass: %w", err)
		p.stop()
		return
	}
	p.rpc = raw.(pb.PassPluginClient)
	p.describe()
}

// launch verifies and starts the plugin process and connects to it.
func (p *Plugin) launch(sum []byte) (plugin.ClientProtocol, error) {
	h := p.host
	cmd, got, closeFd, life, err := verifiedCommand(p.Path, sum)
	if errors.Is(err, errChecksum) {
		p.failed = fmt.Errorf("checksum verification failed: SHA-256 of %s is %s, expected %s", p.Path, hex.EncodeToString(got), hex.EncodeToString(sum))
		return nil, p.failed
	}
	if err != nil {
		return nil, fmt.Errorf("could not read the plugin: %w", err)
	}
	defer closeFd()
	p.life = life // closed when the plugin is stopped
	if afterVerify != nil {
		afterVerify(p.Path)
	}
	p.client = plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  protocol.Handshake,
		VersionedPlugins: protocol.PluginSets(h.opts.Versions, nil),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		StartTimeout:     h.opts.StartTimeout,
		Logger:           newZlog(h.opts.Log, p.File),
		RunnerFunc:       p.runnerFunc(cmd), // process groups, pid known at once
	})
	cc, err := p.client.Client()
	if err != nil {
		if strings.Contains(err.Error(), "timeout") {
			return nil, fmt.Errorf("could not start: no handshake within %s (plugins.start_timeout_ms): %w%s", h.opts.StartTimeout, err, p.startNotes(0))
		}
		return nil, fmt.Errorf("could not start: %w%s", err, p.startNotes(time.Second))
	}
	return cc, nil
}

// startNotes says what a plugin that failed to start left: its exit
// status and the end of what it wrote on stderr (go-plugin logs stderr
// lines at debug level only, so a wrapper's "not found" would be hidden),
// and a hint when a wrapper script looked for files beside "$0".
func (p *Plugin) startNotes(wait time.Duration) string {
	r := p.runner
	if r == nil {
		return ""
	}
	var b strings.Builder
	if st := r.exitStatus(wait); st != "" { // go-plugin waits for an exited one
		fmt.Fprintf(&b, "; the plugin %s", st)
	}
	if tail := r.stderrTail(); tail != "" {
		fmt.Fprintf(&b, "; its stderr: %q", tail)
		if strings.Contains(tail, "/proc/self/fd") {
			fmt.Fprintf(&b, " (the plugin runs from a sealed copy, /proc/self/fd/3, so $0 is not its path: a wrapper finds the files beside it through $%s, not $(dirname \"$0\"))", protocol.EnvDir)
		}
	}
	return b.String()
}

// describe asks for the pass description.
func (p *Plugin) describe() {
	ctx, cancel := context.WithTimeout(context.Background(), p.host.opts.StartTimeout)
	defer cancel()
	resp, err := p.rpc.Describe(ctx, &pb.DescribeRequest{})
	if err != nil {
		if ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded {
			p.failed = fmt.Errorf("Describe did not answer within %s (plugins.start_timeout_ms): the plugin was killed", p.host.opts.StartTimeout)
		} else {
			p.failed = fmt.Errorf("Describe failed: %v", status.Convert(err).Message())
		}
		p.stop()
		return
	}
	d, err := wire.DecodeDescription(resp)
	if err == nil {
		err = pass.CheckName(d.Name) // the rules of built-in names (issue 37: any name was taken)
	}
	if err != nil {
		p.failed = fmt.Errorf("invalid description: %w", err)
		p.stop()
		return
	}
	p.Name, p.Desc = d.Name, d
	p.log = p.log.With().Str("pass", p.Name).Logger()
	p.log.Info().Str("version", d.Version).Int("protocol", p.Version).Msg("plugin loaded")
}

// Connect makes a Plugin of an already connected PassPlugin client (no
// process: tests use go-plugin's in-memory connections).
func Connect(rpc pb.PassPluginClient, opts Options) (*Plugin, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	h := &Host{opts: opts, byName: map[string]*Plugin{}}
	p := &Plugin{File: "(in-process)", host: h, rpc: rpc, log: opts.Log, Version: protocol.Versions[len(protocol.Versions)-1]}
	p.describe()
	if p.failed != nil {
		return nil, p.failed
	}
	h.plugins, h.byName[p.Name] = []*Plugin{p}, p
	return p, nil
}

// stop ends the plugin process and everything in its process group, within
// bounds: a healthy plugin gets stopGrace to exit (go-plugin closes it), a
// failed one none; then the group is killed (a wrapper script's children
// too, which would otherwise hold the pipes go-plugin waits on); go-plugin's
// clean-up gets killWait more and is then given up on, with an error logged.
func (p *Plugin) stop() {
	if p.client == nil || p.done {
		return
	}
	p.done = true
	c := p.client
	// the plugin's descendants, those outside its process group (a child
	// that called setsid) too, listed while the plugin still runs
	desc := descendants(p.pid)
	defer func() {
		if n := killDescendants(desc); n > 0 {
			p.log.Warn().Int("processes", n).Msg("the plugin left processes outside its process group (setsid): killed them")
		}
		if p.life != nil {
			p.life.Close() // the plugin's lifeline: end of file there
			p.life = nil
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Kill()
	}()
	if p.failed == nil {
		select {
		case <-done:
		case <-time.After(stopGrace):
			p.log.Warn().Dur("grace", stopGrace).Msg("plugin did not stop in time: killing its process group")
		}
	}
	if p.pid > 0 && groupAlive(p.pid) {
		if p.failed == nil {
			p.log.Warn().Int("pgid", p.pid).Msg("plugin left processes behind: killing its process group")
		}
		killGroup(p.pid)
	}
	select {
	case <-done:
	case <-time.After(killWait):
		p.log.Error().Int("pgid", p.pid).Msg("the plugin's process group is killed but its output is still held open (a process that left the group?): gave up waiting for it")
	}
	live.Lock()
	delete(live.m, p)
	live.Unlock()
}

// Err says why the plugin cannot be used (nil when it can).
func (p *Plugin) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// PID is the plugin process id (0 when it never ran).
func (p *Plugin) PID() int { return p.pid }

// fail records a fatal failure and stops the process.
func (p *Plugin) fail(err error, kill bool) error {
	p.failed = err
	p.log.Error().Err(err).Msg("plugin failed; it is stopped and disabled")
	if kill {
		p.stop()
	}
	return err
}

// call runs one RPC under the per-call timeout and classifies failures:
// the process exited (crash), the deadline passed (hang: the process is
// killed), the connection broke, or the plugin returned an error (the
// plugin stays usable).
func (p *Plugin) call(method string, f func(ctx context.Context, c pb.PassPluginClient) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed != nil {
		return fmt.Errorf("plugin %s is disabled: %w", p.File, p.failed)
	}
	timeout := p.host.opts.Timeout
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := f(ctx, p.rpc)
	if err == nil {
		return nil
	}
	code := status.Code(err)
	exited := func() bool {
		if p.client == nil {
			return false
		}
		// the connection usually breaks a moment before go-plugin sees the exit
		for i := 0; i < 200 && !p.client.Exited(); i++ { // up to 5 s
			time.Sleep(25 * time.Millisecond)
		}
		return p.client.Exited()
	}
	switch {
	case code == codes.DeadlineExceeded || ctx.Err() != nil:
		return p.fail(fmt.Errorf("%s did not answer within %s (plugins.timeout_ms): the plugin was killed", method, timeout), true)
	case code == codes.Unavailable || code == codes.Canceled:
		if exited() {
			return p.fail(fmt.Errorf("the plugin process exited during %s (crash): %s", method, status.Convert(err).Message()), false)
		}
		return p.fail(fmt.Errorf("lost the connection to the plugin during %s: %s", method, status.Convert(err).Message()), true)
	}
	return &callError{method: method, code: code, msg: status.Convert(err).Message()}
}

// callError is an error the plugin itself returned.
type callError struct {
	method string
	code   codes.Code
	msg    string
}

func (e *callError) Error() string { return fmt.Sprintf("plugin %s error: %s", e.method, e.msg) }

// Registration is the plugin's pass: its Description and a factory of
// fresh instances backed by this plugin.
func (p *Plugin) Registration() pass.Registration {
	return pass.Registration{Description: p.Description(), New: func() pass.Pass { return &Pass{p: p} }}
}

// Lookup implements pass.Resolver.
func (h *Host) Lookup(name string) (pass.Registration, bool) {
	p, ok := h.byName[name]
	if !ok {
		return pass.Registration{}, false
	}
	return p.Registration(), true
}

// Names implements pass.Resolver: every plugin pass, loaded or failed.
func (h *Host) Names() []string {
	out := make([]string, 0, len(h.plugins))
	for _, p := range h.plugins {
		out = append(out, p.Name)
	}
	sort.Strings(out)
	return out
}

// Failures says why plugins could not be loaded or were ignored, one line
// each ("glmflash-pass-x: checksum verification failed: …"): a pass name
// that resolves to nothing is reported with them, never as a bare
// "unknown pass".
func (h *Host) Failures() []string {
	var out []string
	for _, p := range h.plugins {
		if p.failed != nil && p.Desc.Name == "" {
			out = append(out, fmt.Sprintf("%s: %v", p.File, p.failed))
		}
	}
	return append(out, h.ignored...)
}

// Ignored says why files named like plugins provide no pass (not
// executable, a built-in pass's name, a duplicate), one line each.
func (h *Host) Ignored() []string { return append([]string(nil), h.ignored...) }

// Plugins lists the discovered plugins in file-name order.
func (h *Host) Plugins() []*Plugin { return append([]*Plugin(nil), h.plugins...) }

// Plugin returns the plugin providing pass name.
func (h *Host) Plugin(name string) *Plugin { return h.byName[name] }

// StopUnused stops the processes of plugins whose pass is not in keep (they
// were started only to learn their names).
func (h *Host) StopUnused(keep []string) {
	want := map[string]bool{}
	for _, k := range keep {
		want[k] = true
	}
	for _, p := range h.plugins {
		if !want[p.Name] && p.client != nil {
			p.mu.Lock()
			p.stop()
			if p.failed == nil {
				p.failed = errors.New("stopped: the pass is not listed in passes")
			}
			p.mu.Unlock()
		}
	}
}

// Close stops every plugin process.
func (h *Host) Close() error {
	for _, p := range h.plugins {
		p.mu.Lock()
		p.stop()
		p.mu.Unlock()
	}
	return nil
}

// PIDs lists the process ids of the plugins this host started.
func (h *Host) PIDs() []int {
	var out []int
	for _, p := range h.plugins {
		if p.pid > 0 {
			out = append(out, p.pid)
		}
	}
	return out
}
