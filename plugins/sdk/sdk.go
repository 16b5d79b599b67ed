// Package sdk is what a pass-plugin author imports. Write the pass exactly
// as a built-in one (a pass.Description, and Eligible and Apply of the
// pass.Pass interface of core/pass, over the IR of core/ir; options declared
// once as a tagged struct, statistics as another, see pass.WithOptions and
// pass.Counters) and serve it from main:
//
//	func main() { sdk.Serve(Description, &MyPass{}) }
//
// Describe answers with the description (name, version, summary, requires,
// options; the protocol carries no speculation statements, so the engine
// reports a plugin's pass as stating nothing about verify and draft graphs).
//
// Build the binary as glmflash-pass-<name>, put it in the engine's
// plugins.dir with its SHA-256 in plugins.checksums (or plugins.sums_file)
// and list the pass by name in passes:. The engine runs the binary as a
// subprocess (hashicorp/go-plugin over gRPC with mutual TLS) and calls
// Describe, Configure, Eligible and Apply; the SDK turns those calls into
// calls of the pass, over a graph decoded from the engine's.
//
// What a pass sees: the graph (weights are leaves named by checkpoint
// tensor, never bytes) and the eligibility environment (model config,
// weight dtypes, attention-TP topology, LoRA targets, capture-hidden
// layers, host-lengths flag, program name). Weight changes are derived
// weights built with const ops (concat_rows, stack). There is no way, and no
// need, to read or write the engine's files through the protocol.
//
// Apply: the engine sends back the OK sites of its Eligible call; the SDK
// runs Eligible again on the freshly decoded graph (Eligible must be a pure
// function of the graph, environment and options), picks those sites by
// label (Where and Layer, distinct among OK sites) with their Nodes and
// private Data, and calls Apply. The result must verify.
package sdk

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/plugins/protocol"
	"github.com/glmflash/glmflash/plugins/wire"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
)

// Version is the SDK's version, reported by Describe.
const Version = "1.0.0"

var (
	logMu  sync.Mutex
	logger hclog.Logger = hclog.NewNullLogger()
)

// Log is the plugin's logger: its lines appear in the engine's log with the
// plugin's name (JSON over stderr, which go-plugin forwards).
func Log() hclog.Logger {
	logMu.Lock()
	defer logMu.Unlock()
	return logger
}

// Options tune Serve (most plugins need none).
type Options struct {
	// Versions are the protocol versions to serve (default: every version
	// this SDK speaks).
	Versions []int
}

// Serve serves p, the pass d describes, to the engine and returns when the
// engine is done with the plugin. Run by hand (not by the engine) it prints
// a notice and exits. Run by the engine, the plugin exits when the engine
// does, however it ends, and takes its descendants with it (life.go).
func Serve(d pass.Description, p pass.Pass) { ServeWith(d, p, Options{}) }

// ServeWith is Serve with options.
func ServeWith(d pass.Description, p pass.Pass, o Options) {
	if len(o.Versions) == 0 {
		o.Versions = protocol.Versions
	}
	l := hclog.New(&hclog.LoggerOptions{Name: d.Name, Output: os.Stderr, JSONFormat: true, Level: hclog.Debug})
	logMu.Lock()
	logger = l
	logMu.Unlock()
	if os.Getenv(protocol.MagicCookieKey) == protocol.MagicCookieValue { // run by a host
		watchHost()
		defer killDescendants() // stopped by the host: nothing of the plugin's outlives it
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  protocol.Handshake,
		VersionedPlugins: protocol.PluginSets(o.Versions, NewServer(d, p)),
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger:           l,
	})
}

// NewServer returns the PassPlugin service for p, the pass d describes
// (Serve uses it; tests can serve it over go-plugin's in-memory
// connections).
func NewServer(d pass.Description, p pass.Pass) pb.PassPluginServer { return &server{d: d, p: p} }

type server struct {
	pb.UnimplementedPassPluginServer
	d   pass.Description
	p   pass.Pass
	mu  sync.Mutex // one call at a time: a pass instance is not concurrent
	cur string     // the options the pass was last configured with
}

// guard turns a panic of the pass into an error answer.
func guard(method string, err *error) {
	if r := recover(); r != nil {
		Log().Error("pass panicked", "method", method, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		*err = status.Errorf(codes.Internal, "%s: pass panicked: %v", method, r)
	}
}

func (s *server) Describe(context.Context, *pb.DescribeRequest) (resp *pb.DescribeResponse, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer guard("Describe", &err)
	d, err := pass.DescriptionOf(s.d, s.p)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "describe: %v", err)
	}
	resp, err = wire.EncodeDescription(d)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "describe: %v", err)
	}
	resp.SdkVersion = Version
	return resp, nil
}

// configure (re)configures the pass when the options differ from the
// current ones. Errors are INVALID_ARGUMENT.
func (s *server) configure(opts []*pb.Attr) error {
	m, err := wire.DecodeAttrs(opts)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "options: %v", err)
	}
	key := fmt.Sprint(m)
	if key == s.cur {
		return nil
	}
	if err := pass.Configure(s.d, s.p, m, ""); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	s.cur = key
	return nil
}

func (s *server) Configure(_ context.Context, req *pb.ConfigureRequest) (_ *pb.ConfigureResponse, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer guard("Configure", &err)
	s.cur = "\x00" // force
	if err := s.configure(req.GetOptions()); err != nil {
		return nil, err
	}
	return &pb.ConfigureResponse{}, nil
}

// decode prepares a call: options, graph and environment.
func (s *server) decode(opts []*pb.Attr, mg *pb.Graph, me *pb.Env) (*ir.Graph, *pass.Env, error) {
	if err := s.configure(opts); err != nil {
		return nil, nil, err
	}
	g, err := wire.DecodeGraph(mg)
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "graph: %v", err)
	}
	env, err := wire.DecodeEnv(me)
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "environment: %v", err)
	}
	return g, env, nil
}

func (s *server) Eligible(_ context.Context, req *pb.EligibleRequest) (_ *pb.EligibleResponse, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer guard("Eligible", &err)
	g, env, err := s.decode(req.GetOptions(), req.GetGraph(), req.GetEnv())
	if err != nil {
		return nil, err
	}
	sites := s.p.Eligible(g, pass.NewAnalyses(g), env)
	seen := map[string]bool{}
	for _, st := range sites {
		key := fmt.Sprintf("%s\x00%d", st.Where, st.Layer)
		if st.OK && seen[key] {
			return nil, status.Errorf(codes.Internal, "two OK sites are labelled %q (layer %d): OK sites need distinct labels (Apply finds them by label)", st.Where, st.Layer)
		}
		seen[key] = seen[key] || st.OK
	}
	ws, err := wire.EncodeSites(g, sites)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "sites: %v", err)
	}
	return &pb.EligibleResponse{Sites: ws}, nil
}

func (s *server) Apply(_ context.Context, req *pb.ApplyRequest) (_ *pb.ApplyResponse, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer guard("Apply", &err)
	g, env, err := s.decode(req.GetOptions(), req.GetGraph(), req.GetEnv())
	if err != nil {
		return nil, err
	}
	type key struct {
		where string
		layer int32
	}
	all := s.p.Eligible(g, pass.NewAnalyses(g), env)
	byKey := map[key]pass.Site{}
	for _, st := range all {
		if st.OK {
			byKey[key{st.Where, int32(st.Layer)}] = st
		}
	}
	var chosen []pass.Site
	for _, w := range req.GetSites() {
		st, ok := byKey[key{w.GetWhere(), w.GetLayer()}]
		if !ok {
			return nil, status.Errorf(codes.FailedPrecondition, "site %q (layer %d) is not an eligible site of this graph", w.GetWhere(), w.GetLayer())
		}
		chosen = append(chosen, st)
	}
	res, err := s.p.Apply(g, chosen)
	if err != nil {
		return nil, status.Errorf(codes.Aborted, "%v", err)
	}
	if err := g.Verify(); err != nil {
		return nil, status.Errorf(codes.Internal, "the pass produced a graph that does not verify: %v", err)
	}
	enc, err := wire.EncodeGraph(g)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "graph: %v", err)
	}
	return &pb.ApplyResponse{Graph: enc.Graph, Fired: int32(res.Fired), Notes: res.Notes, Statistics: wire.EncodeStats(res.Stats)}, nil
}
