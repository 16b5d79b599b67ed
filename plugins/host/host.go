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
	"github.com/glmflash/glmflash/internal/regular"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/plugins/protocol"
	"github.com/glmflash/glmflash/plugins/wire"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
)

// DefaultTimeout bounds each call to a plugin when plugins.timeout_ms is 0.
const DefaultTimeout = 10 * time.Second

// minStartTimeout is the least time start-up (process start, handshake,
// Describe) gets, whatever the per-call timeout.
const minStartTimeout = 10 * time.Second

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
func OptionsFromConfig(ec *config.Engine, log zerolog.Logger) Options {
	o := Options{Dir: ec.Plugins.Dir, Checksums: ec.Plugins.Checksums, SumsFile: ec.Plugins.SumsFile,
		AllowUnverified: ec.Plugins.AllowUnverified, Timeout: time.Duration(ec.Plugins.TimeoutMS) * time.Millisecond,
		Log: log, Requested: map[string]map[string]any{}}
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
	pid    int
	failed error // sticky: why the plugin cannot be used
}

// Open discovers, verifies and starts the plugins of opts.Dir. Errors are
// for the configuration only (an unreadable directory or sums file); a
// plugin that fails is recorded as failed, logged, and its pass reports it.
func Open(opts Options) (*Host, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
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
	files, err := discover(opts.Dir)
	if err != nil {
		return nil, err
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
			continue
		}
		if other, dup := h.byName[p.Name]; dup {
			err := fmt.Errorf("plugins %s and %s both provide pass %q: %s ignored", other.File, f, p.Name, f)
			p.log.Error().Err(err).Msg("plugin not loaded")
			p.stop()
			continue
		}
		h.byName[p.Name] = p
		h.plugins = append(h.plugins, p)
	}
	return h, nil
}

// discover lists the plugin executables of dir, sorted.
func discover(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("plugins.dir: %w", err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), protocol.FilePrefix) || len(e.Name()) == len(protocol.FilePrefix) {
			continue
		}
		info, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			continue
		}
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out, nil
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
		sc := bufio.NewScanner(f)
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

// fileSum is the SHA-256 of a file, for messages.
func fileSum(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "unreadable: " + err.Error()
	}
	return hex.EncodeToString(h.Sum(nil))
}

// start runs the plugin (sum nil: unverified) and asks for its description.
func (p *Plugin) start(sum []byte) {
	h := p.host
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  protocol.Handshake,
		VersionedPlugins: protocol.PluginSets(h.opts.Versions, nil),
		Cmd:              exec.Command(p.Path),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		Managed:          true, // plugin.CleanupClients kills it
		StartTimeout:     max(h.opts.Timeout, minStartTimeout),
		Logger:           newZlog(h.opts.Log, p.File),
	}
	if sum != nil {
		cfg.SecureConfig = &plugin.SecureConfig{Checksum: sum, Hash: sha256.New()}
	}
	p.client = plugin.NewClient(cfg)
	cc, err := p.client.Client()
	if err != nil {
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			err = fmt.Errorf("checksum verification failed: SHA-256 of %s is %s, expected %s", p.Path, fileSum(p.Path), hex.EncodeToString(sum))
		} else {
			err = fmt.Errorf("could not start: %w", err)
		}
		p.failed = err
		p.stop()
		return
	}
	if rc := p.client.ReattachConfig(); rc != nil {
		p.pid = rc.Pid
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

// describe asks for the pass description.
func (p *Plugin) describe() {
	ctx, cancel := context.WithTimeout(context.Background(), max(p.host.opts.Timeout, minStartTimeout))
	defer cancel()
	resp, err := p.rpc.Describe(ctx, &pb.DescribeRequest{})
	if err != nil {
		p.failed = fmt.Errorf("Describe failed: %v", status.Convert(err).Message())
		p.stop()
		return
	}
	d, err := wire.DecodeDescription(resp)
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
	h := &Host{opts: opts, byName: map[string]*Plugin{}}
	p := &Plugin{File: "(in-process)", host: h, rpc: rpc, log: opts.Log, Version: protocol.Versions[len(protocol.Versions)-1]}
	p.describe()
	if p.failed != nil {
		return nil, p.failed
	}
	h.plugins, h.byName[p.Name] = []*Plugin{p}, p
	return p, nil
}

// stop kills the plugin process, if any.
func (p *Plugin) stop() {
	if p.client != nil {
		p.client.Kill()
	}
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
		if p.pid > 0 {
			if pr, e := os.FindProcess(p.pid); e == nil {
				_ = pr.Kill()
			}
		}
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

// Factory makes fresh pass instances backed by this plugin.
func (p *Plugin) Factory() pass.Factory { return func() pass.Pass { return &Pass{p: p} } }

// Lookup implements pass.Resolver.
func (h *Host) Lookup(name string) (pass.Factory, bool) {
	p, ok := h.byName[name]
	if !ok {
		return nil, false
	}
	return p.Factory(), true
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
				p.failed = errors.New("stopped: the pass is not requested in passes:")
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
