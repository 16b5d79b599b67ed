// Package wire converts between the engine's IR, eligibility environment
// and sites (core/ir, core/pass) and the plugin protocol's messages
// (proto/glmflash/plugin/v1). Both sides of the plugin boundary use it: the
// host (plugins/host) and the SDK a plugin links (plugins/sdk).
//
// The IR round-trips losslessly: Decode(Encode(g)).Text() == g.Text() and
// the decoded graph verifies. Value ids on the wire are dense and local to
// one message (inputs, then weight leaves, then node outputs in order).
package wire

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
)

// ---- attributes -------------------------------------------------------------

// EncodeAttrValue encodes an attribute or option value (int, float64,
// string, bool or []int; an option's pass.Path travels as a string).
func EncodeAttrValue(v any) (*pb.AttrValue, error) {
	switch x := v.(type) {
	case int:
		return &pb.AttrValue{Value: &pb.AttrValue_Int{Int: int64(x)}}, nil
	case float64:
		return &pb.AttrValue{Value: &pb.AttrValue_Float{Float: x}}, nil
	case string:
		return &pb.AttrValue{Value: &pb.AttrValue_Str{Str: x}}, nil
	case pass.Path:
		return &pb.AttrValue{Value: &pb.AttrValue_Str{Str: string(x)}}, nil
	case bool:
		return &pb.AttrValue{Value: &pb.AttrValue_Bool{Bool: x}}, nil
	case []int:
		l := &pb.IntList{Values: make([]int64, len(x))}
		for i, e := range x {
			l.Values[i] = int64(e)
		}
		return &pb.AttrValue{Value: &pb.AttrValue_Ints{Ints: l}}, nil
	}
	return nil, fmt.Errorf("unsupported value type %T", v)
}

// DecodeAttrValue is the inverse of EncodeAttrValue.
func DecodeAttrValue(m *pb.AttrValue) (any, error) {
	if m == nil {
		return nil, fmt.Errorf("missing value")
	}
	switch x := m.Value.(type) {
	case *pb.AttrValue_Int:
		return toInt(x.Int)
	case *pb.AttrValue_Float:
		return x.Float, nil
	case *pb.AttrValue_Str:
		return x.Str, nil
	case *pb.AttrValue_Bool:
		return x.Bool, nil
	case *pb.AttrValue_Ints:
		out := make([]int, len(x.Ints.GetValues()))
		for i, e := range x.Ints.GetValues() {
			v, err := toInt(e)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("empty value")
}

func toInt(v int64) (int, error) {
	if v > math.MaxInt || v < math.MinInt {
		return 0, fmt.Errorf("integer %d out of range", v)
	}
	return int(v), nil
}

// EncodeAttrs encodes a map sorted by key.
func EncodeAttrs(a map[string]any) ([]*pb.Attr, error) {
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*pb.Attr, 0, len(keys))
	for _, k := range keys {
		v, err := EncodeAttrValue(a[k])
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", k, err)
		}
		out = append(out, &pb.Attr{Key: k, Value: v})
	}
	return out, nil
}

// DecodeAttrs decodes attributes; a key given twice is an error.
func DecodeAttrs(as []*pb.Attr) (map[string]any, error) {
	out := make(map[string]any, len(as))
	for _, a := range as {
		if _, dup := out[a.GetKey()]; dup {
			return nil, fmt.Errorf("attribute %q given twice", a.GetKey())
		}
		v, err := DecodeAttrValue(a.GetValue())
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", a.GetKey(), err)
		}
		out[a.GetKey()] = v
	}
	return out, nil
}

// ---- values -----------------------------------------------------------------

func encodeKind(k ir.Kind) pb.Kind {
	switch k {
	case ir.Activation:
		return pb.Kind_KIND_ACTIVATION
	case ir.Input:
		return pb.Kind_KIND_INPUT
	case ir.Weight:
		return pb.Kind_KIND_WEIGHT
	}
	return pb.Kind_KIND_UNSPECIFIED
}

func encodeDType(d ir.DType) pb.DType {
	switch d {
	case ir.F32:
		return pb.DType_DTYPE_F32
	case ir.I32:
		return pb.DType_DTYPE_I32
	case ir.Host:
		return pb.DType_DTYPE_HOST
	}
	return pb.DType_DTYPE_UNSPECIFIED
}

func decodeDType(d pb.DType) (ir.DType, error) {
	switch d {
	case pb.DType_DTYPE_F32:
		return ir.F32, nil
	case pb.DType_DTYPE_I32:
		return ir.I32, nil
	case pb.DType_DTYPE_HOST:
		return ir.Host, nil
	}
	return "", fmt.Errorf("unknown dtype %v", d)
}

func decodeShape(s []int64) ([]int, error) {
	out := make([]int, len(s))
	for i, d := range s {
		if d < int64(ir.DimC) {
			return nil, fmt.Errorf("dimension %d is invalid", d)
		}
		v, err := toInt(d)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// ---- graphs -----------------------------------------------------------------

// Encoding is an encoded graph with the numbering it used.
type Encoding struct {
	Graph *pb.Graph
	// IDs maps every value defined in the graph to its wire id.
	IDs map[*ir.Value]int32
}

// EncodeGraph encodes g. Every value a node reads must be defined earlier
// (a graph that verifies always is).
func EncodeGraph(g *ir.Graph) (*Encoding, error) {
	e := &Encoding{Graph: &pb.Graph{Name: g.Name}, IDs: map[*ir.Value]int32{}}
	var err error
	// the typed properties (mode, MTP layer) travel as graph attributes,
	// spelt as protocol version 1 always has: mode="decode", mtp_layer=8
	if e.Graph.Attrs, err = EncodeAttrs(g.HeaderAttrs()); err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	def := func(v *ir.Value) *pb.Value {
		id := int32(len(e.IDs))
		e.IDs[v] = id
		m := &pb.Value{Id: id, Name: v.Name, Kind: encodeKind(v.Kind), Dtype: encodeDType(v.DType), Ref: v.Ref, Stack: int32(v.Stack)}
		for _, d := range v.Shape {
			m.Shape = append(m.Shape, int64(d))
		}
		return m
	}
	for _, v := range g.Inputs {
		e.Graph.Inputs = append(e.Graph.Inputs, def(v))
	}
	for _, v := range g.Weights {
		e.Graph.Weights = append(e.Graph.Weights, def(v))
	}
	for i, n := range g.Nodes {
		m := &pb.Node{Op: n.Op, Layer: int32(n.Layer)}
		for j, in := range n.Inputs {
			id, ok := e.IDs[in]
			if !ok {
				return nil, fmt.Errorf("node %d (%s): input %d is not defined before use", i, n.Op, j)
			}
			m.Inputs = append(m.Inputs, id)
		}
		if m.Attrs, err = EncodeAttrs(n.Attrs); err != nil {
			return nil, fmt.Errorf("node %d (%s): %w", i, n.Op, err)
		}
		for _, o := range n.Outputs {
			m.Outputs = append(m.Outputs, def(o))
		}
		e.Graph.Nodes = append(e.Graph.Nodes, m)
	}
	names := make([]string, 0, len(g.Outputs))
	for k := range g.Outputs {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		id, ok := e.IDs[g.Outputs[k]]
		if !ok {
			return nil, fmt.Errorf("graph output %q is not defined", k)
		}
		e.Graph.Outputs = append(e.Graph.Outputs, &pb.Output{Name: k, Value: id})
	}
	return e, nil
}

// Binder decides what the inputs and weight leaves of a decoded graph
// become. DecodeGraph creates fresh ones; the host binds them to the
// engine graph's own values.
type Binder interface {
	Input(i int, name string, dt ir.DType, shape []int) (*ir.Value, error)
	Weight(name, ref string, stack int, shape []int) (*ir.Value, error)
}

// freshBinder declares inputs and weights in a new graph.
type freshBinder struct{ g *ir.Graph }

func (b freshBinder) Input(_ int, name string, dt ir.DType, shape []int) (*ir.Value, error) {
	return b.g.AddInput(name, dt, shape...), nil
}

func (b freshBinder) Weight(name, ref string, stack int, shape []int) (*ir.Value, error) {
	if stack > 0 {
		if len(shape) == 0 || shape[0] != stack {
			return nil, fmt.Errorf("stacked weight %q: shape %v does not start with its stack count %d", ref, shape, stack)
		}
		return b.g.AddStackedWeight(ref, stack, shape[1:]...).Named(name), nil
	}
	for _, w := range b.g.Weights {
		if w.Ref == ref && w.Stack == 0 {
			return nil, fmt.Errorf("weight %q is listed twice", ref)
		}
	}
	return b.g.AddWeight(ref, shape...).Named(name), nil
}

// DecodeGraph decodes a graph into a new ir.Graph. Unknown ops, types that
// disagree with shape inference, undefined or redefined values are errors.
func DecodeGraph(m *pb.Graph) (*ir.Graph, error) {
	g := ir.New(m.GetName())
	attrs, err := DecodeAttrs(m.GetAttrs())
	if err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	if err := g.SetHeaderAttrs(attrs); err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	c, err := Decode(g, m, freshBinder{g})
	if err != nil {
		return nil, err
	}
	g.Nodes, g.Outputs = c.Nodes, c.Outputs
	return g, nil
}

// Contents are a decoded graph's nodes, weight leaves and outputs, built in
// (but not yet installed into) a target graph.
type Contents struct {
	Nodes   []*ir.Node
	Weights []*ir.Value
	Outputs map[string]*ir.Value
}

// Decode builds m's nodes in g (fresh node and value objects typed by the
// op set's shape inference, which must agree with the types on the wire),
// with inputs and weight leaves resolved by b. It does not modify g's node
// list or outputs; the caller installs the returned contents.
func Decode(g *ir.Graph, m *pb.Graph, b Binder) (*Contents, error) {
	vals := map[int32]*ir.Value{}
	define := func(id int32, v *ir.Value, where string) error {
		if _, dup := vals[id]; dup {
			return fmt.Errorf("%s: value id %d defined twice", where, id)
		}
		vals[id] = v
		return nil
	}
	for i, in := range m.GetInputs() {
		where := fmt.Sprintf("input %d (%s)", i, in.GetName())
		if in.GetKind() != pb.Kind_KIND_INPUT {
			return nil, fmt.Errorf("%s: kind %v, want input", where, in.GetKind())
		}
		dt, err := decodeDType(in.GetDtype())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		shape, err := decodeShape(in.GetShape())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		v, err := b.Input(i, in.GetName(), dt, shape)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if err := define(in.GetId(), v, where); err != nil {
			return nil, err
		}
	}
	c := &Contents{Outputs: map[string]*ir.Value{}}
	for i, w := range m.GetWeights() {
		where := fmt.Sprintf("weight %d (%s)", i, w.GetRef())
		if w.GetKind() != pb.Kind_KIND_WEIGHT || w.GetRef() == "" {
			return nil, fmt.Errorf("%s: a weight leaf needs kind weight and a checkpoint reference", where)
		}
		if w.GetDtype() != pb.DType_DTYPE_F32 {
			return nil, fmt.Errorf("%s: weights are f32, got %v", where, w.GetDtype())
		}
		if w.GetStack() < 0 || (w.GetStack() > 0) != strings.Contains(w.GetRef(), ir.ExpertPlaceholder) {
			return nil, fmt.Errorf("%s: a stacked weight (stack %d) must use {e} in its reference, and only a stacked one", where, w.GetStack())
		}
		shape, err := decodeShape(w.GetShape())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		for _, d := range shape {
			if d < 0 {
				return nil, fmt.Errorf("%s: weights have static shapes, got %v", where, shape)
			}
		}
		v, err := b.Weight(w.GetName(), w.GetRef(), int(w.GetStack()), shape)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if err := define(w.GetId(), v, where); err != nil {
			return nil, err
		}
		c.Weights = append(c.Weights, v)
	}
	for i, nm := range m.GetNodes() {
		where := fmt.Sprintf("node %d (%s, layer %d)", i, nm.GetOp(), nm.GetLayer())
		def, ok := ir.Lookup(nm.GetOp())
		if !ok {
			return nil, fmt.Errorf("%s: unknown op %q (not registered in this engine)", where, nm.GetOp())
		}
		attrs, err := DecodeAttrs(nm.GetAttrs())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		ins := make([]*ir.Value, len(nm.GetInputs()))
		for j, id := range nm.GetInputs() {
			v, ok := vals[id]
			if !ok {
				return nil, fmt.Errorf("%s: input %d (value id %d) is not defined before use", where, j, id)
			}
			ins[j] = v
		}
		n, err := g.NewNode(nm.GetOp(), int(nm.GetLayer()), attrs, ins...)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if len(n.Outputs) != len(nm.GetOutputs()) {
			return nil, fmt.Errorf("%s: %d outputs on the wire, shape inference says %d", where, len(nm.GetOutputs()), len(n.Outputs))
		}
		wantKind := pb.Kind_KIND_ACTIVATION
		if def.Const() {
			wantKind = pb.Kind_KIND_WEIGHT
		}
		for j, om := range nm.GetOutputs() {
			o := n.Outputs[j]
			dt, err := decodeDType(om.GetDtype())
			if err != nil {
				return nil, fmt.Errorf("%s: output %d: %w", where, j, err)
			}
			shape, err := decodeShape(om.GetShape())
			if err != nil {
				return nil, fmt.Errorf("%s: output %d: %w", where, j, err)
			}
			if dt != o.DType || !slices.Equal(shape, o.Shape) {
				return nil, fmt.Errorf("%s: output %d is %s on the wire, shape inference says %s", where, j, ir.FormatShape(dt, shape), ir.FormatShape(o.DType, o.Shape))
			}
			if om.GetKind() != wantKind || om.GetRef() != "" || om.GetStack() != 0 {
				return nil, fmt.Errorf("%s: output %d must be kind %v without a checkpoint reference", where, j, wantKind)
			}
			o.Name = om.GetName()
			if err := define(om.GetId(), o, where); err != nil {
				return nil, err
			}
		}
		c.Nodes = append(c.Nodes, n)
	}
	for _, o := range m.GetOutputs() {
		v, ok := vals[o.GetValue()]
		if !ok {
			return nil, fmt.Errorf("graph output %q: value id %d is not defined", o.GetName(), o.GetValue())
		}
		if _, dup := c.Outputs[o.GetName()]; dup {
			return nil, fmt.Errorf("graph output %q is listed twice", o.GetName())
		}
		c.Outputs[o.GetName()] = v
	}
	return c, nil
}

// ---- environment ------------------------------------------------------------

// EncodeEnv encodes env for graph g: weight dtypes are sent for the
// checkpoint tensors g's weight leaves refer to (stacked leaves expanded).
func EncodeEnv(env *pass.Env, g *ir.Graph) (*pb.Env, error) {
	m := &pb.Env{Tp: &pb.Topology{Size: int32(env.TP.Size), Rank: int32(env.TP.Rank), Known: env.TP.Known},
		HostLengths: env.HostLengths, Program: env.Program, WeightsKnown: env.Weights != nil, WeightDtypes: map[string]string{}}
	if env.Model != nil {
		b, err := json.Marshal(env.Model)
		if err != nil {
			return nil, fmt.Errorf("model config: %w", err)
		}
		m.ModelConfigJson = b
	}
	if env.Weights != nil {
		for _, w := range g.Weights {
			for _, name := range w.LeafNames() {
				if dt, ok := env.Weights.DType(name); ok {
					m.WeightDtypes[name] = dt.String()
				}
			}
		}
	}
	for _, t := range env.LoRA {
		lt := &pb.LoRATarget{Adapter: t.Adapter, Module: t.Module}
		for _, l := range t.Layers {
			lt.Layers = append(lt.Layers, int32(l))
		}
		m.Lora = append(m.Lora, lt)
	}
	var layers []int
	for l, on := range env.CaptureHidden {
		if on {
			layers = append(layers, l)
		}
	}
	sort.Ints(layers)
	for _, l := range layers {
		m.CaptureHidden = append(m.CaptureHidden, int32(l))
	}
	return m, nil
}

// DTypes is a WeightInfo from a name → dtype map.
type DTypes map[string]safetensors.DType

// DType implements pass.WeightInfo.
func (d DTypes) DType(name string) (safetensors.DType, bool) {
	dt, ok := d[name]
	return dt, ok
}

// DecodeEnv decodes an environment.
func DecodeEnv(m *pb.Env) (*pass.Env, error) {
	env := &pass.Env{HostLengths: m.GetHostLengths(), Program: m.GetProgram(), CaptureHidden: map[int]bool{},
		TP: pass.Topology{Size: int(m.GetTp().GetSize()), Rank: int(m.GetTp().GetRank()), Known: m.GetTp().GetKnown()}}
	if len(m.GetModelConfigJson()) > 0 {
		var cfg model.Config
		if err := json.Unmarshal(m.GetModelConfigJson(), &cfg); err != nil {
			return nil, fmt.Errorf("model config: %w", err)
		}
		env.Model = &cfg
	}
	if m.GetWeightsKnown() {
		d := DTypes{}
		for name, s := range m.GetWeightDtypes() {
			dt, err := safetensors.ParseDType(s)
			if err != nil {
				return nil, fmt.Errorf("weight %s: %w", name, err)
			}
			d[name] = dt
		}
		env.Weights = d
	}
	for _, t := range m.GetLora() {
		lt := pass.LoRATarget{Adapter: t.GetAdapter(), Module: t.GetModule()}
		for _, l := range t.GetLayers() {
			lt.Layers = append(lt.Layers, int(l))
		}
		env.LoRA = append(env.LoRA, lt)
	}
	for _, l := range m.GetCaptureHidden() {
		env.CaptureHidden[int(l)] = true
	}
	return env, nil
}

// ---- sites ------------------------------------------------------------------

// EncodeSites encodes sites of graph g (nodes as indices into g.Nodes).
func EncodeSites(g *ir.Graph, sites []pass.Site) ([]*pb.Site, error) {
	idx := make(map[*ir.Node]int32, len(g.Nodes))
	for i, n := range g.Nodes {
		idx[n] = int32(i)
	}
	out := make([]*pb.Site, 0, len(sites))
	for _, s := range sites {
		m := &pb.Site{Where: s.Where, Layer: int32(s.Layer), Ok: s.OK, Reason: s.Reason, Note: s.Note}
		for _, n := range s.Nodes {
			i, ok := idx[n]
			if !ok {
				return nil, fmt.Errorf("site %q refers to a node that is not in the graph", s.Where)
			}
			m.Nodes = append(m.Nodes, i)
		}
		out = append(out, m)
	}
	return out, nil
}

// DecodeSites decodes sites against g (node indices into g.Nodes).
func DecodeSites(g *ir.Graph, ms []*pb.Site) ([]pass.Site, error) {
	out := make([]pass.Site, 0, len(ms))
	for _, m := range ms {
		s := pass.Site{Where: m.GetWhere(), Layer: int(m.GetLayer()), OK: m.GetOk(), Reason: m.GetReason(), Note: m.GetNote()}
		if s.Where == "" {
			return nil, fmt.Errorf("a site has no label (where)")
		}
		if !s.OK && s.Reason == "" {
			return nil, fmt.Errorf("site %q is skipped without a reason", s.Where)
		}
		for _, i := range m.GetNodes() {
			if i < 0 || int(i) >= len(g.Nodes) {
				return nil, fmt.Errorf("site %q: node index %d out of range (graph has %d nodes)", s.Where, i, len(g.Nodes))
			}
			s.Nodes = append(s.Nodes, g.Nodes[i])
		}
		out = append(out, s)
	}
	return out, nil
}

// ---- descriptions -----------------------------------------------------------

// EncodeDescription encodes a pass description.
func EncodeDescription(d pass.Description) (*pb.DescribeResponse, error) {
	m := &pb.DescribeResponse{Name: d.Name, Version: d.Version, Summary: d.Summary, Requires: d.Requires}
	for _, o := range d.Options {
		def, err := EncodeAttrValue(o.Default)
		if err != nil {
			return nil, fmt.Errorf("option %s default: %w", o.Name, err)
		}
		m.Options = append(m.Options, &pb.OptionSpec{Name: o.Name, Type: string(o.Type), Default: def, Doc: o.Doc, Enum: o.Enum})
	}
	return m, nil
}

// DecodeDescription decodes a pass description, checking option types and
// that each default has its option's type.
func DecodeDescription(m *pb.DescribeResponse) (pass.Description, error) {
	d := pass.Description{Name: m.GetName(), Version: m.GetVersion(), Summary: m.GetSummary(), Requires: m.GetRequires()}
	if d.Name == "" {
		return d, fmt.Errorf("the plugin describes a pass without a name")
	}
	for _, o := range m.GetOptions() {
		def, err := DecodeAttrValue(o.GetDefault())
		if err != nil {
			return d, fmt.Errorf("option %s default: %w", o.GetName(), err)
		}
		opt := pass.Option{Name: o.GetName(), Type: pass.OptionType(o.GetType()), Doc: o.GetDoc(), Enum: o.GetEnum()}
		switch opt.Type {
		case pass.Bool, pass.Int, pass.Float, pass.String, pass.Ints, pass.PathType:
		default:
			return d, fmt.Errorf("option %s has unknown type %q", opt.Name, opt.Type)
		}
		norm, err := pass.Normalize([]pass.Option{opt}, map[string]any{opt.Name: def}, "")
		if err != nil {
			return d, fmt.Errorf("option %s: default %v does not have type %s", opt.Name, def, opt.Type)
		}
		opt.Default = norm[opt.Name]
		d.Options = append(d.Options, opt)
	}
	return d, nil
}

// ---- statistics -------------------------------------------------------------

// EncodeStats encodes a pass's statistics.
func EncodeStats(st []pass.Statistic) []*pb.Statistic {
	out := make([]*pb.Statistic, len(st))
	for i, s := range st {
		out[i] = &pb.Statistic{Name: s.Name, Value: s.Value, Doc: s.Doc}
	}
	return out
}

// DecodeStats decodes statistics; each needs a name, used once.
func DecodeStats(ms []*pb.Statistic) ([]pass.Statistic, error) {
	var out []pass.Statistic
	seen := map[string]bool{}
	for _, m := range ms {
		if m.GetName() == "" || seen[m.GetName()] {
			return nil, fmt.Errorf("statistic name %q is empty or given twice", m.GetName())
		}
		seen[m.GetName()] = true
		out = append(out, pass.Statistic{Name: m.GetName(), Value: m.GetValue(), Doc: m.GetDoc()})
	}
	return out, nil
}
