// Package autotune is the prefill-autotune pass: it chooses GEMM kernel
// parameters (column grain, row blocking) per weight shape and token-count
// bucket by measuring candidates, persists the winners in a tuning table
// under configs/tuning/ keyed by CPU model, GEMM implementation (the
// kernels measured: avx512, avx2 or go), op, dtype, shape and bucket, and
// loads that table on later starts (another implementation's table is not
// applied: one skipped site says so). A bucket with no entry keeps the default
// parameters and is reported as skipped.
//
// On a device backend that measures its own GEMMs (pass.Env.Tuner: the
// CUDA backend), the choices are the backend's kernels and library
// algorithms (cuBLASLt), timed on the device with its events, and the
// table is the device model's (configs/tuning/cuda-nvidia-h200.json).
package autotune

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Name is the pass's YAML name.
const Name = "prefill-autotune"

// Description is the pass as the registry, the report and `glmflash passes list`
// know it.
var Description = pass.Description{Name: Name, Version: "1.0.0",
	Summary: "measure GEMM kernel parameters per shape and token bucket; persist and reuse a tuning table",
	Verify:  "eligible: verify spans are GEMM rows like any other; the bucket is the batch's token count (each speculating sequence's last token and drafts)",
	Draft:   "eligible: the MTP layer's GEMMs are tuned like the trunk's (draft steps are one row per sequence, the draft extend one per committed token); a DFlash draft graph's GEMMs too (its block rows, and its context rows for fc and the context K/V projections)"}

func init() { pass.Register(Description, func() pass.Pass { return &Pass{} }) }

// Options are the pass's options.
type Options struct {
	TuneAtStart bool      `option:"tune_at_start" doc:"measure buckets that have no table entry (else they keep defaults)"`
	Buckets     []int     `option:"buckets" default:"1,8,64,512" doc:"token-count buckets (a batch of T tokens uses the smallest bucket ≥ T)"`
	TableDir    pass.Path `option:"table_dir" default:"configs/tuning" doc:"directory of tuning tables"`
	Reps        int       `option:"reps" default:"3" doc:"timed repetitions per candidate (median)"`
	Tolerance   float64   `option:"tolerance" default:"1e-4" doc:"reject candidates whose outputs differ from the default by more (relative)"`
	CPU         string    `option:"cpu" doc:"override the CPU model key (tests)"`
	ISA         string    `option:"isa" doc:"override the GEMM implementation key (tests; default: the implementation in use, kernels/gemm.Impl)"`
	GPU         string    `option:"gpu" doc:"override the device model key of device tables (tests)"`
}

// Validate implements pass.Validator.
func (o *Options) Validate() error {
	if len(o.Buckets) == 0 {
		return fmt.Errorf("option buckets must not be empty")
	}
	for _, b := range o.Buckets {
		if b < 1 {
			return fmt.Errorf("option buckets: %d is not a positive token count", b)
		}
	}
	if o.Reps < 1 {
		return fmt.Errorf("option reps must be ≥ 1")
	}
	return nil
}

// Stats are the pass's statistics.
type Stats struct {
	Measured int `stat:"entries_measured" doc:"table entries measured at start"`
	Nodes    int `stat:"nodes_tuned" doc:"GEMM nodes given tuned parameters"`
}

// Pass implements pass.Pass.
type Pass struct {
	opts Options
	// Tuned counts entries measured by this instance (for tests).
	Tuned int
	// saved is the table file the measurements went to.
	saved string
}

// Options implements pass.WithOptions.
func (p *Pass) Options() any { return &p.opts }

func (p *Pass) dir() string { return string(p.opts.TableDir) }

// cpu is the CPU model key of the tables.
func (p *Pass) cpu() string {
	if p.opts.CPU != "" {
		return p.opts.CPU
	}
	return CPUModel()
}

// isa is the GEMM implementation key of the tables.
func (p *Pass) isa() string {
	if p.opts.ISA != "" {
		return p.opts.ISA
	}
	return gemm.Impl()
}

type shapeSite struct {
	N, K, bucket int
	entry        Entry
	nodes        []*ir.Node
}

// Eligible implements pass.Pass: one site per (GEMM shape, bucket) of the
// nodes whose op has the GEMM trait, plus one skipped site naming the other
// kernel ops. With tune_at_start, missing
// entries are measured here (and persisted in Apply).
func (p *Pass) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	if env.Device != "" && env.Device != "cpu" {
		return p.eligibleDevice(g, env)
	}
	table, err := LoadTable(p.dir(), p.cpu(), p.isa())
	if err != nil {
		return []pass.Site{pass.Skip("tuning table", -1, "%v", err)}
	}
	var sites []pass.Site
	if others := OtherTables(p.dir(), p.cpu(), p.isa()); len(others) > 0 {
		sites = append(sites, pass.Skip("tuning table", -1, "not applied: %s measured other GEMM kernels than the %q ones this process runs (%s)",
			strings.Join(others, ", "), p.isa(), filepath.Base(TablePath(p.dir(), p.cpu(), p.isa()))+" is this CPU's and implementation's table"))
	}
	type shape struct {
		N, K int
		dt   string
	}
	nodes := map[shape][]*ir.Node{}
	var order []shape
	var untunable []string
	for _, n := range g.Nodes {
		d := n.Def()
		switch {
		case d.GEMM != nil:
			gs := d.GEMM(n)
			s := shape{gs.N, gs.K, weightDType(gs.Weight, env)}
			if _, seen := nodes[s]; !seen {
				order = append(order, s)
			}
			nodes[s] = append(nodes[s], n)
		case !d.Const() && !slices.Contains(untunable, n.Op):
			untunable = append(untunable, n.Op)
		}
	}
	if len(untunable) > 0 {
		sort.Strings(untunable)
		sites = append(sites, pass.Skip("ops without the GEMM trait", -1, "no tunable kernel: %s", strings.Join(untunable, ", ")))
	}
	buckets := slices.Sorted(slices.Values(p.opts.Buckets))
	for _, s := range order {
		for _, b := range buckets {
			where := fmt.Sprintf("gemm %dx%d %s @ %d tokens", s.N, s.K, s.dt, b)
			e, ok := table.Get("gemm", s.dt, s.N, s.K, b)
			if !ok && p.opts.TuneAtStart {
				e, err = p.tune(s.N, s.K, b, s.dt)
				if err != nil {
					sites = append(sites, pass.Skip(where, -1, "tuning failed: %v", err))
					continue
				}
				table.Put(e)
				p.Tuned++
				ok = true
			}
			if !ok {
				sites = append(sites, pass.Skip(where, -1, "no tuning entry for this bucket and tune_at_start is off: default kernel parameters"))
				continue
			}
			sites = append(sites, pass.Site{Where: where, Layer: -1, OK: true, Data: &shapeSite{N: s.N, K: s.K, bucket: b, entry: e, nodes: nodes[s]},
				Note: fmt.Sprintf("col_grain %d, row_block %d", e.ColGrain, e.RowBlock)})
		}
	}
	if p.Tuned > 0 {
		if err := table.Save(p.dir()); err != nil {
			sites = append(sites, pass.Skip("tuning table", -1, "could not persist: %v", err))
		}
		p.saved = TablePath(p.dir(), p.cpu(), p.isa())
	}
	return sites
}

// Apply implements pass.Pass: every GEMM node of a tuned shape gets its
// per-bucket parameters as attributes (the executor picks by batch size).
func (p *Pass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	per := map[*ir.Node][]*shapeSite{}
	var order []*ir.Node
	for _, s := range sites {
		ss := s.Data.(*shapeSite)
		for _, n := range ss.nodes {
			if _, ok := per[n]; !ok {
				order = append(order, n)
			}
			per[n] = append(per[n], ss)
		}
	}
	for _, n := range order {
		list := per[n]
		sort.Slice(list, func(i, j int) bool { return list[i].bucket < list[j].bucket })
		var bs, cg, rb []int
		var ks []string
		for _, ss := range list {
			bs = append(bs, ss.bucket)
			cg = append(cg, ss.entry.ColGrain)
			rb = append(rb, ss.entry.RowBlock)
			ks = append(ks, ss.entry.Kernel)
		}
		ir.AttrTuneBuckets.Set(n, bs)
		if list[0].entry.Kernel != "" { // a device table: the backend's kernel choices
			n.Attrs.Put(ir.AttrTuneKernels.Is(strings.Join(ks, ";")), ir.AttrTuneKind.Is(list[0].entry.DType))
			continue
		}
		n.Attrs.Put(ir.AttrTuneColGrain.Is(cg), ir.AttrTuneRowBlock.Is(rb))
	}
	res := pass.Result{Fired: len(sites), Stats: pass.Counters(&Stats{Measured: p.Tuned, Nodes: len(order)})}
	if p.Tuned > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("measured %d new entries, saved to %s", p.Tuned, p.saved))
	}
	return res, nil
}

// eligibleDevice is Eligible on a device backend: the choices are the
// backend's, measured by env.Tuner on the device, in the device model's
// table. Library choices (cuBLASLt algorithms) belong to the library
// version that made them: a table from another version is re-measured
// (tune_at_start) or its library entries skipped.
func (p *Pass) eligibleDevice(g *ir.Graph, env *pass.Env) []pass.Site {
	t := env.Tuner
	if t == nil {
		return []pass.Site{pass.Skip("device "+env.Device, -1, "no GEMM tuner for this device here (an engine on a device backend that measures its GEMMs provides one)")}
	}
	info := t.TunerInfo()
	device, model, library := info.Device, info.Model, info.Library
	if p.opts.GPU != "" {
		model = p.opts.GPU
	}
	table, err := LoadDeviceTable(p.dir(), device, model)
	if err != nil {
		return []pass.Site{pass.Skip("tuning table", -1, "%v", err)}
	}
	stale := table.Library != "" && table.Library != library
	type shape struct {
		N, K int
		kind string
	}
	nodes := map[shape][]*ir.Node{}
	var order []shape
	for _, n := range g.Nodes {
		if d := n.Def(); d.GEMM != nil {
			gs := d.GEMM(n)
			s := shape{gs.N, gs.K, t.GEMMKind(checkpointDType(gs.Weight, env))}
			if _, seen := nodes[s]; !seen {
				order = append(order, s)
			}
			nodes[s] = append(nodes[s], n)
		}
	}
	var sites []pass.Site
	buckets := slices.Sorted(slices.Values(p.opts.Buckets))
	for _, s := range order {
		for _, b := range buckets {
			where := fmt.Sprintf("gemm %dx%d %s @ %d tokens", s.N, s.K, s.kind, b)
			if c := t.GEMMCandidates(s.kind, b); len(c) < 2 {
				sites = append(sites, pass.Skip(where, -1, "only one kernel (%s) runs this on %s: nothing to choose", strings.Join(c, ""), model))
				continue
			}
			e, ok := table.Get("gemm", s.kind, s.N, s.K, b)
			if ok && stale && strings.HasPrefix(e.Kernel, "lt:") {
				ok = false
				if !p.opts.TuneAtStart {
					sites = append(sites, pass.Skip(where, -1, "the entry's cuBLASLt algorithm was measured with %s, this is %s: re-tune (tune_at_start)", table.Library, library))
					continue
				}
			}
			if !ok && p.opts.TuneAtStart {
				c, err := t.TuneGEMM(ir.GEMMTune{Kind: s.kind, N: s.N, K: s.K, Rows: b, Reps: p.opts.Reps, Tolerance: p.opts.Tolerance})
				if err != nil {
					sites = append(sites, pass.Skip(where, -1, "tuning failed: %v", err))
					continue
				}
				e = Entry{Op: "gemm", DType: s.kind, N: s.N, K: s.K, Bucket: b, Kernel: c.Kernel, KernelName: c.Name,
					DefaultNS: c.DefaultNs, TunedNS: c.TunedNs, Measured: c.Measured, Rejected: c.Rejected}
				table.Put(e)
				p.Tuned++
				ok = true
			}
			if !ok {
				sites = append(sites, pass.Skip(where, -1, "no tuning entry for this bucket and tune_at_start is off: default kernels"))
				continue
			}
			sites = append(sites, pass.Site{Where: where, Layer: -1, OK: true, Data: &shapeSite{N: s.N, K: s.K, bucket: b, entry: e, nodes: nodes[s]},
				Note: fmt.Sprintf("%s (%d ns, default %d ns; %d candidates, %d rejected)", kernelName(e), e.TunedNS, e.DefaultNS, e.Measured, e.Rejected)})
		}
	}
	if p.Tuned > 0 {
		table.Library = library
		if err := table.Save(p.dir()); err != nil {
			sites = append(sites, pass.Skip("tuning table", -1, "could not persist: %v", err))
		}
		p.saved = DeviceTablePath(p.dir(), device, model)
	}
	return sites
}

func kernelName(e Entry) string {
	if e.KernelName != "" {
		return e.KernelName
	}
	return e.Kernel
}

// checkpointDType is the checkpoint dtype of a GEMM's weight ("BF16",
// "F32", "F8_E4M3"): a derived weight's when all its sources agree, else
// "F32".
func checkpointDType(w *ir.Value, env *pass.Env) string {
	if w.Producer != nil {
		dt := ""
		for _, in := range w.Producer.Inputs {
			d := checkpointDType(in, env)
			if dt != "" && d != dt {
				return safetensors.F32.String()
			}
			dt = d
		}
		if dt == "" {
			return safetensors.F32.String()
		}
		return dt
	}
	if w.Ref == "" {
		return safetensors.F32.String()
	}
	return env.WeightDType(w.Ref).String()
}

// Candidates are the parameter sets measured for each entry.
func Candidates() []gemm.Params {
	var out []gemm.Params
	for _, cg := range []int{4, 16, 64} {
		for _, rb := range []int{16, 64, 256} {
			out = append(out, gemm.Params{ColGrain: cg, RowBlock: rb})
		}
	}
	return out
}

// tune measures every candidate on random data of the entry's shape and
// keeps the fastest one whose output agrees with the default parameters.
func (p *Pass) tune(N, K, T int, dt string) (Entry, error) {
	r := rand.New(rand.NewPCG(uint64(N*131+K), uint64(T)))
	x := make([]float32, T*K)
	w := make([]float32, N*K)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	ref := make([]float32, T*N)
	out := make([]float32, T*N)
	def := gemm.Default()
	wb := make([]uint16, len(w))
	gemm.Float32sToBF16(wb, w)
	run := func(prm gemm.Params, dst []float32) {
		if dt == "bf16" {
			gemm.MatMulTBF16With(prm, dst, x, T, K, wb, N)
		} else {
			gemm.MatMulTWith(prm, dst, x, T, K, w, N)
		}
	}
	run(def, ref)
	measure := func(prm gemm.Params) int64 {
		var ts []int64
		for i := 0; i < p.opts.Reps; i++ {
			t0 := time.Now()
			run(prm, out)
			ts = append(ts, time.Since(t0).Nanoseconds())
		}
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
		return ts[len(ts)/2]
	}
	defNS := measure(def)
	best, bestNS := def, defNS
	for _, c := range Candidates() {
		ns := measure(c)
		if gemm.MaxRelDiff(out, ref) > p.opts.Tolerance {
			continue // rejected: differs from the default beyond tolerance
		}
		if ns < bestNS {
			best, bestNS = c, ns
		}
	}
	return Entry{Op: "gemm", DType: dt, N: N, K: K, Bucket: T, ColGrain: best.ColGrain, RowBlock: best.RowBlock, DefaultNS: defNS, TunedNS: bestNS}, nil
}

// weightDType is the GEMM flavour the executor will use for a weight:
// "bf16" when it comes from BF16 checkpoint tensors (stored as bf16 and
// multiplied by the BF16 kernel), else "f32".
func weightDType(w *ir.Value, env *pass.Env) string {
	if checkpointDType(w, env) == safetensors.BF16.String() {
		return "bf16"
	}
	return "f32"
}
