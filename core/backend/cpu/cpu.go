// Package cpu is the CPU backend: every op of the IR bound to a Go kernel
// (kernels/*, with AVX2/AVX-512 assembly where it pays), buffers reused by
// liveness, sequence state in a cache.Store on the Go heap.
package cpu

import (
	"fmt"
	"runtime"
	"sort"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/model"
)

func init() {
	backend.Register("cpu", func(o backend.Options) (backend.Backend, error) {
		prec, err := backend.ParsePrecision(string(o.Precision))
		if err != nil {
			return nil, fmt.Errorf("cpu backend: precision %q is not implemented (fp32 or bf16)", o.Precision)
		}
		o.Precision = prec
		return New(o), nil
	}, boundOps)
}

// Backend is the CPU backend.
type Backend struct {
	opts backend.Options
	w    *weights
	// poisonLengths makes seq_lengths nodes produce wrong lengths (set by
	// tests through export_test.go: a graph that never reads them is
	// unaffected).
	poisonLengths bool
}

// New returns a CPU backend with options o.
func New(o backend.Options) *Backend { return &Backend{opts: o, w: newWeights()} }

// LazyWeights is true: the engine compiles lazy plans, and the backend
// loads each constant as its binder asks — GEMM weights as the
// checkpoint's bf16 bytes in place (or one bf16 copy), FP8 weights of
// linears and experts as their codes in place, never as float32
// (plan.Raw), other constants as float32 (plan.Const).
func (b *Backend) LazyWeights() bool { return true }

// Name is "cpu".
func (b *Backend) Name() string { return "cpu" }

// binder binds one node: it returns the closure that runs it.
type binder func(p *Program, n *ir.Node) (func(rc *runCtx) error, error)

// gemmBinder binds an op with the GEMM trait; prm picks the kernel
// parameters for a batch of R rows (the node's tuned attributes, or the
// defaults).
type gemmBinder func(p *Program, n *ir.Node, prm func(R int) gemm.Params) (func(rc *runCtx) error, error)

// bindings is the CPU backend's op table; every family file registers its
// ops in an init function. tunable holds the ops bound with bindGEMM.
var (
	bindings = map[string]binder{}
	tunable  = map[string]bool{}
)

func bind(op string, f binder) {
	if _, dup := bindings[op]; dup {
		panic("cpu: op " + op + " bound twice")
	}
	bindings[op] = f
}

// bindGEMM binds a GEMM-trait op: its binder gets the tuned parameters.
func bindGEMM(op string, f gemmBinder) {
	bind(op, func(p *Program, n *ir.Node) (func(rc *runCtx) error, error) { return f(p, n, gemmParams(n)) })
	tunable[op] = true
}

func boundOps() []string {
	var ops []string
	for op := range bindings {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	return ops
}

// Ops lists the bound ops.
func (b *Backend) Ops() []string { return boundOps() }

// NewStore makes a heap-backed cache store of the given layers, its
// latents and pooled keys in a pool of o.Pages pages of o.PageTokens tokens
// (cache.Options' defaults), in fp32 (kv dtype auto or fp32) or fp8 (kv
// dtype fp8: e4m3 with per-block scales, cache.KVFP8).
func (b *Backend) NewStore(cfg *model.Config, layers []int, o backend.StoreOptions) (backend.Store, error) {
	kd, err := backend.ParseKVDType(string(o.KVDType))
	if err != nil {
		return nil, fmt.Errorf("cpu: kv dtype: %w", err)
	}
	if kd == backend.KVBF16 {
		return nil, fmt.Errorf("cpu: kv dtype bf16 is not implemented on the cpu backend (its latents are fp32 or fp8: auto, fp32 or fp8)")
	}
	kv := cache.KVF32
	if kd == backend.KVFP8 {
		kv = cache.KVFP8
	}
	st, err := cache.New(cfg, layers, cache.Options{Slots: o.Slots, PageTokens: o.PageTokens, Pages: o.Pages, MaxPositions: o.MaxPositions, KV: kv})
	if err != nil {
		return nil, err
	}
	if err := st.SetRollbackDepth(o.Rollback); err != nil {
		return nil, err
	}
	return st, nil
}

// NewDraftStore makes a heap-backed DFlash draft store (cache.DraftStore).
func (b *Backend) NewDraftStore(layers, width int, o backend.StoreOptions) (backend.Store, error) {
	return cache.NewDraftStore(layers, width, o.Slots)
}

// Info describes the CPU; Memory is the bytes of the weights bound so far
// by dtype and place (MemBF16Mapped, MemBF16, MemFP32, MemFP8,
// MemFP8Scales).
// Precision is the option's ("fp32" when unset).
func (b *Backend) Info() backend.Info {
	prec := b.opts.Precision
	if prec == "" {
		prec = backend.FP32
	}
	return backend.Info{Backend: "cpu", Device: fmt.Sprintf("%s/%s, %d threads", runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0)), Precision: prec,
		Memory: b.w.memory()}
}

// Close releases the weight copies the backend made (its programs become
// unusable).
func (b *Backend) Close() error { return b.w.close() }

// Compile binds every step of p.
func (b *Backend) Compile(p *plan.Plan) (backend.Program, error) {
	prog := &Program{plan: p, opts: b.opts, poisonLengths: b.poisonLengths, w: b.w, consts: map[*ir.Value][]float32{}, gemmBound: map[*ir.Value]bool{}}
	for _, n := range p.Steps {
		f, ok := bindings[n.Op]
		if !ok {
			return nil, fmt.Errorf("cpu: %s (layer %d): no kernel bound to op %q", n.Op, n.Layer, n.Op)
		}
		fn, err := f(prog, n)
		if err != nil {
			return nil, fmt.Errorf("cpu: %s (layer %d): %w", n.Op, n.Layer, err)
		}
		prog.steps = append(prog.steps, step{node: n, run: fn})
	}
	// constants a kernel reads through runCtx.in, not asked for by a binder
	for _, n := range p.Steps {
		for _, in := range n.Inputs {
			if _, ok := prog.consts[in]; ok || prog.gemmBound[in] || !p.IsConst(in) {
				continue
			}
			if _, err := prog.constErr(in); err != nil {
				return nil, fmt.Errorf("cpu: %s (layer %d): %w", n.Op, n.Layer, err)
			}
		}
	}
	dropResident(p)
	return prog, nil
}

// dropResident releases the checkpoint's mapped pages from the resident set
// once a program's weights are bound: binding read the tensors it copied
// (into packed bf16 or float32 copies) from the mapping, and those pages
// would otherwise stay resident beside the copies; the weights kernels read
// in place come back from the page cache on the next run (the kernel maps
// them back a batch of pages per fault).
func dropResident(p *plan.Plan) {
	src := p.Source()
	if c, ok := src.(*plan.WeightCache); ok {
		src = c.Source()
	}
	if d, ok := src.(interface{ DropResident() error }); ok {
		_ = d.DropResident() // advice only: nothing to undo when refused
	}
}
