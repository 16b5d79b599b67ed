package host

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/glmflash/glmflash/plugins/wire"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
	"google.golang.org/grpc/codes"
)

// Pass is a plugin's pass as the pipeline sees it. Eligible and Apply
// serialize the graph, call the plugin and (Apply) validate the returned
// graph before it replaces the engine graph's contents.
type Pass struct {
	p    *Plugin
	opts []*pb.Attr
}

var (
	_ pass.Configurable        = (*Pass)(nil)
	_ pass.FallibleEligibility = (*Pass)(nil)
)

// Description is the plugin's pass as the pipeline registers it: the
// description it gave (Describe). A plugin that could not be loaded is
// described by its failure and accepts the options the configuration gives
// it, so that the failure shows in the pass report.
func (p *Plugin) Description() pass.Description {
	if p.Desc.Name != "" {
		return p.Desc
	}
	d := pass.Description{Name: p.Name, Version: "unloaded", Summary: fmt.Sprintf("plugin %s (not loaded: %v)", p.File, p.Err())}
	opts := p.host.opts.Requested[p.Name]
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		d.Options = append(d.Options, pass.Option{Name: k, Type: optionType(opts[k]), Default: opts[k]})
	}
	return d
}

func optionType(v any) pass.OptionType {
	switch v.(type) {
	case bool:
		return pass.Bool
	case int, int64:
		return pass.Int
	case float64:
		return pass.Float
	case []int, []any:
		return pass.Ints
	}
	return pass.String
}

// Configure implements pass.Configurable: the plugin checks the options (an
// INVALID_ARGUMENT answer is a configuration error, like a built-in pass's);
// a plugin that is down fails later, in the report.
func (a *Pass) Configure(opts map[string]any) error {
	if a.p.Desc.Name == "" {
		return nil
	}
	enc, err := wire.EncodeAttrs(opts)
	if err != nil {
		return err
	}
	a.opts = enc
	err = a.p.call("Configure", func(ctx context.Context, c pb.PassPluginClient) error {
		_, err := c.Configure(ctx, &pb.ConfigureRequest{Options: enc})
		return err
	})
	if ce, ok := err.(*callError); ok && ce.code == codes.InvalidArgument {
		return fmt.Errorf("plugin %s rejected its options: %s", a.p.File, ce.msg)
	}
	return nil
}

// siteData travels from Eligible to Apply on every site.
type siteData struct {
	env  *pass.Env
	penv *pb.Env
}

// EligibleE implements pass.FallibleEligibility.
func (a *Pass) EligibleE(g *ir.Graph, _ *pass.Analyses, env *pass.Env) ([]pass.Site, error) {
	sites, err := a.eligible(g, env)
	if err != nil {
		a.p.log.Error().Str("program", env.Program).Err(err).Msg("plugin pass failed in Eligible; graph unchanged")
	}
	return sites, err
}

func (a *Pass) eligible(g *ir.Graph, env *pass.Env) ([]pass.Site, error) {
	if err := a.p.Err(); err != nil {
		return nil, fmt.Errorf("plugin %s is not usable: %w", a.p.File, err)
	}
	enc, err := wire.EncodeGraph(g)
	if err != nil {
		return nil, fmt.Errorf("encode graph: %w", err)
	}
	penv, err := wire.EncodeEnv(env, g)
	if err != nil {
		return nil, fmt.Errorf("encode environment: %w", err)
	}
	var resp *pb.EligibleResponse
	err = a.p.call("Eligible", func(ctx context.Context, c pb.PassPluginClient) error {
		var err error
		resp, err = c.Eligible(ctx, &pb.EligibleRequest{Graph: enc.Graph, Env: penv, Options: a.opts})
		return err
	})
	if err != nil {
		return nil, err
	}
	sites, err := wire.DecodeSites(g, resp.GetSites())
	if err != nil {
		return nil, fmt.Errorf("plugin returned invalid sites: %w", err)
	}
	d := &siteData{env: env, penv: penv}
	for i := range sites {
		sites[i].Data = d
	}
	return sites, nil
}

// Eligible implements pass.Pass (the pipeline calls EligibleE); a failure
// becomes one skipped site carrying the reason.
func (a *Pass) Eligible(g *ir.Graph, an *pass.Analyses, env *pass.Env) []pass.Site {
	sites, err := a.EligibleE(g, an, env)
	if err != nil {
		return []pass.Site{pass.Skip("plugin "+a.p.File, -1, "plugin failed: %v", err)}
	}
	return sites
}

// Apply implements pass.Pass.
func (a *Pass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	res, err := a.apply(g, sites)
	if err != nil {
		a.p.log.Error().Err(err).Msg("plugin pass failed in Apply; graph unchanged")
	}
	return res, err
}

func (a *Pass) apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	if len(sites) == 0 {
		return pass.Result{}, nil
	}
	d, ok := sites[0].Data.(*siteData)
	if !ok {
		return pass.Result{}, fmt.Errorf("sites did not come from this pass's Eligible")
	}
	enc, err := wire.EncodeGraph(g)
	if err != nil {
		return pass.Result{}, fmt.Errorf("encode graph: %w", err)
	}
	ws, err := wire.EncodeSites(g, sites)
	if err != nil {
		return pass.Result{}, err
	}
	var resp *pb.ApplyResponse
	err = a.p.call("Apply", func(ctx context.Context, c pb.PassPluginClient) error {
		var err error
		resp, err = c.Apply(ctx, &pb.ApplyRequest{Graph: enc.Graph, Env: d.penv, Options: a.opts, Sites: ws})
		return err
	})
	if err != nil {
		return pass.Result{}, err
	}
	stats, err := wire.DecodeStats(resp.GetStatistics())
	if err != nil {
		return pass.Result{}, fmt.Errorf("plugin returned invalid statistics: %w", err)
	}
	if err := Install(g, resp.GetGraph(), d.env.Weights); err != nil {
		return pass.Result{}, fmt.Errorf("plugin returned an invalid graph: %w", err)
	}
	return pass.Result{Fired: int(resp.GetFired()), Notes: resp.GetNotes(), Stats: stats}, nil
}

// TensorInfo is implemented by weight sources that know tensor shapes
// (model.Checkpoint); the host then also checks the shapes of weight
// leaves a plugin adds.
type TensorInfo interface {
	Info(name string) (safetensors.TensorInfo, bool)
}

// Install validates a graph returned by a plugin and makes it g's contents.
// The returned graph must decode against g: the same inputs (a plugin cannot
// add graph inputs), the same graph name, attributes and output names, only
// registered ops with types that agree with shape inference, every value
// defined before use; every weight leaf must be a leaf g already has or an
// existing checkpoint tensor of the model (checked through weights; no file
// is read and no weight bytes are involved); finally g must verify. On error
// g is left as it was.
func Install(g *ir.Graph, m *pb.Graph, weights pass.WeightInfo) error {
	if m == nil {
		return fmt.Errorf("no graph")
	}
	if m.GetName() != g.Name {
		return fmt.Errorf("graph name changed from %q to %q", g.Name, m.GetName())
	}
	attrs, err := wire.DecodeAttrs(m.GetAttrs())
	if err != nil {
		return err
	}
	if ir.Attrs(attrs).Format() != g.HeaderAttrs().Format() {
		return fmt.Errorf("graph attributes changed from %s to %s", g.HeaderAttrs().Format(), ir.Attrs(attrs).Format())
	}
	if len(m.GetInputs()) != len(g.Inputs) {
		return fmt.Errorf("graph has %d inputs, the plugin returned %d (plugins cannot add or remove graph inputs)", len(g.Inputs), len(m.GetInputs()))
	}
	oldNodes, oldWeights, oldOutputs := g.Nodes, g.Weights, g.Outputs
	restore := func() { g.Nodes, g.Weights, g.Outputs = oldNodes, oldWeights, oldOutputs }
	g.Weights = append([]*ir.Value(nil), oldWeights...)
	c, err := wire.Decode(g, m, &engineBinder{g: g, old: oldWeights, weights: weights})
	if err != nil {
		restore()
		return err
	}
	if len(c.Outputs) != len(oldOutputs) {
		restore()
		return fmt.Errorf("graph outputs changed from %s to %s", outputNames(oldOutputs), outputNames(c.Outputs))
	}
	for name := range oldOutputs {
		if _, ok := c.Outputs[name]; !ok {
			restore()
			return fmt.Errorf("graph outputs changed from %s to %s", outputNames(oldOutputs), outputNames(c.Outputs))
		}
	}
	g.Nodes, g.Weights, g.Outputs = c.Nodes, c.Weights, c.Outputs
	if err := g.Verify(); err != nil {
		restore()
		return fmt.Errorf("does not verify: %w", err)
	}
	return nil
}

func outputNames(m map[string]*ir.Value) string {
	var n []string
	for k := range m {
		n = append(n, k)
	}
	sort.Strings(n)
	return "[" + strings.Join(n, ", ") + "]"
}

// engineBinder binds a returned graph's inputs and weight leaves to the
// engine graph's values.
type engineBinder struct {
	g       *ir.Graph
	old     []*ir.Value
	weights pass.WeightInfo
}

func (b *engineBinder) Input(i int, name string, dt ir.DType, shape []int) (*ir.Value, error) {
	v := b.g.Inputs[i]
	if v.Name != name || v.DType != dt || !slices.Equal(v.Shape, shape) {
		return nil, fmt.Errorf("graph input %d is %s %s, the plugin returned %s %s (plugins cannot change graph inputs)",
			i, v.Name, ir.FormatShape(v.DType, v.Shape), name, ir.FormatShape(dt, shape))
	}
	return v, nil
}

func (b *engineBinder) Weight(name, ref string, stack int, shape []int) (*ir.Value, error) {
	for _, w := range b.old {
		if w.Ref == ref && w.Stack == stack && slices.Equal(w.Shape, shape) {
			return w, nil
		}
	}
	// a checkpoint tensor the graph did not use yet
	if b.weights == nil {
		return nil, fmt.Errorf("new weight leaf %q cannot be checked: the engine has no weight catalog", ref)
	}
	per := shape
	if stack > 0 {
		if len(shape) == 0 || shape[0] != stack {
			return nil, fmt.Errorf("stacked weight %q: shape %v does not start with its stack count %d", ref, shape, stack)
		}
		per = shape[1:]
	}
	ti, _ := b.weights.(TensorInfo)
	for _, n := range (&ir.Value{Ref: ref, Stack: stack}).LeafNames() {
		if _, ok := b.weights.DType(n); !ok {
			return nil, fmt.Errorf("weight leaf refers to %q, which is not a tensor of the model's checkpoint", n)
		}
		if ti != nil {
			if info, ok := ti.Info(n); ok && !slices.Equal(info.Shape, per) {
				return nil, fmt.Errorf("weight leaf %q is %v in the checkpoint, the plugin says %v", n, info.Shape, per)
			}
		}
	}
	var v *ir.Value
	if stack > 0 {
		v = b.g.AddStackedWeight(ref, stack, per...)
	} else {
		v = b.g.AddWeight(ref, shape...)
		if !slices.Equal(v.Shape, shape) {
			return nil, fmt.Errorf("weight %q is %v in the graph, the plugin says %v", ref, v.Shape, shape)
		}
	}
	return v.Named(name), nil
}
