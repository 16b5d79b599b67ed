package bench

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/core/roofline"
	"github.com/glmflash/glmflash/internal/cpulimits"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Defaults of Spec.Bandwidth and Spec.PeakTFLOPs (bench's --bandwidth-gbs
// and --peak-tflops).
const (
	// DefaultCUDABandwidthGBs: the H200's HBM roofline the issue and
	// shared/docs/gpu.md state: a large device-to-device copy moved about
	// 4.3 TB/s (read + written). (A small copy measured by kbench, the
	// 65.5 MB lm_head in 33.84 µs, moves 3.9 TB/s: pass
	// --bandwidth-gbs to use another figure.)
	DefaultCUDABandwidthGBs = 4300
	// DefaultCPUBandwidthGBs: the development machine's measured read
	// bandwidth (2 threads), as the project's brief states it; used on cpu
	// only when the limits (--limits or the quick probe) have none.
	DefaultCPUBandwidthGBs = 49
	// DefaultPeakTFLOPs: the H200's dense BF16 tensor-core peak.
	DefaultPeakTFLOPs = 790
	// gemmReportReps are the timed runs per candidate of the GEMM report.
	gemmReportReps = 3
	// gemmReportTolerance is prefill-autotune's default: candidates whose
	// output differs more from the default kernel's are not counted.
	gemmReportTolerance = 1e-4
)

// rooflineFor fills a decode series' roofline fields: the bytes a step of
// B sequences at context tokens reads, its time at bw GB/s, and the
// measured time per step (device time when the backend reports it, else
// wall-clock from the median tokens/s) over it.
func rooflineFor(r *Series, cfg *model.Config, held roofline.Holding, B, context int, bw float64) error {
	s, err := roofline.Decode(cfg, held, B, context)
	if err != nil {
		return err
	}
	r.RooflineBytes = s.Total()
	r.RooflineContext = context
	r.RooflineTerms = map[string]float64{}
	for _, t := range s.Terms() {
		r.RooflineTerms[t.Name] = t.Bytes
	}
	r.RooflineExperts = s.ExpertsPerLayer
	r.RooflineMs = s.Seconds(bw*1e9) * 1e3
	r.WallMsPerStep = 1e3 * float64(B) / r.TokensPerSec
	r.MeasuredClock, r.MeasuredMs = "wall", r.WallMsPerStep
	if r.DeviceMsPerStep > 0 {
		r.MeasuredClock, r.MeasuredMs = "device", r.DeviceMsPerStep
	}
	if r.RooflineMs > 0 {
		r.RooflineRatio = r.MeasuredMs / r.RooflineMs
		r.RooflineFraction = r.RooflineMs / r.MeasuredMs
	}
	return nil
}

// GEMMShape is one weight shape of the GEMM report.
type GEMMShape struct {
	N           int     `json:"n"`
	K           int     `json:"k"`
	Kind        string  `json:"kind"`
	Count       int     `json:"count"`
	Rows        int     `json:"rows"`
	DefaultUs   float64 `json:"default_us,omitempty"`
	DefaultTF   float64 `json:"default_tflops,omitempty"`
	BestUs      float64 `json:"best_us,omitempty"`
	BestTF      float64 `json:"best_tflops,omitempty"`
	BestKernel  string  `json:"best_kernel,omitempty"`
	Measured    int     `json:"candidates_measured,omitempty"`
	Rejected    int     `json:"candidates_rejected,omitempty"`
	Error       string  `json:"error,omitempty"`
	flopsPerRun float64
}

// GEMMReport is the prefill program's GEMMs measured by the backend.
type GEMMReport struct {
	Rows       int         `json:"rows"`
	PeakTFLOPs float64     `json:"peak_tflops"`
	Shapes     []GEMMShape `json:"shapes"`
	// FLOP-weighted totals over the measured shapes: the graph's GEMM
	// FLOPs (each shape × its count) over the time they take.
	DefaultTF float64 `json:"default_tflops"`
	BestTF    float64 `json:"best_tflops"`
	// NotCovered names what the report leaves out.
	NotCovered string `json:"not_covered"`
}

// prefillGEMMs lists the distinct GEMM weight shapes of a plan's linear,
// linear_split and linear_batched nodes with their kinds (from the
// weights' checkpoint dtypes) and how many GEMMs of each the plan runs (a
// linear_batched node counts its groups).
func prefillGEMMs(p *plan.Plan, t ir.GEMMTuner, dtype func(string) (safetensors.DType, bool)) []GEMMShape {
	type key struct {
		N, K int
		kind string
	}
	idx := map[key]int{}
	var rows []GEMMShape
	for _, n := range p.Steps {
		var N, K, count int
		switch n.Op {
		case ir.OpLinear, ir.OpLinearSplit:
			w := n.Inputs[1].Shape
			N, K, count = w[0], w[1], 1
		case ir.OpLinearBatched:
			w := n.Inputs[1].Shape
			N, K, count = w[1], w[2], w[0]
		default:
			continue
		}
		k := key{N, K, t.GEMMKind(weightDType(n.Inputs[1], dtype))}
		i, ok := idx[k]
		if !ok {
			i = len(rows)
			idx[k] = i
			rows = append(rows, GEMMShape{N: N, K: K, Kind: k.kind})
		}
		rows[i].Count += count
	}
	return rows
}

// weightDType is a GEMM weight's checkpoint dtype ("BF16", "F32",
// "F8_E4M3"): a derived weight's when its sources agree, else F32 (as
// prefill-autotune decides).
func weightDType(w *ir.Value, dtype func(string) (safetensors.DType, bool)) string {
	if w.Producer != nil {
		dt := ""
		for _, in := range w.Producer.Inputs {
			d := weightDType(in, dtype)
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
	if d, ok := dtype(w.Ref); ok && w.Ref != "" {
		return d.String()
	}
	return safetensors.F32.String()
}

// measureGEMMs times every shape at rows rows with the backend's tuner: the
// default kernel's and the best candidate's median times and TFLOP/s
// (2·rows·N·K over the time). A shape the tuner refuses keeps its error.
func measureGEMMs(t ir.GEMMTuner, shapes []GEMMShape, rows int, peak float64) *GEMMReport {
	rep := &GEMMReport{Rows: rows, PeakTFLOPs: peak, Shapes: shapes,
		NotCovered: "the MoE grouped expert GEMM (moe_experts: gate/up and down over the routed tokens) is not measured: TuneGEMM covers linear, linear_split and linear_batched weights only"}
	var flops, defNs, bestNs float64
	for i := range rep.Shapes {
		s := &rep.Shapes[i]
		s.Rows = rows
		s.flopsPerRun = 2 * float64(rows) * float64(s.N) * float64(s.K)
		c, err := t.TuneGEMM(ir.GEMMTune{Kind: s.Kind, N: s.N, K: s.K, Rows: rows, Reps: gemmReportReps, Tolerance: gemmReportTolerance})
		if err != nil {
			s.Error = err.Error()
			continue
		}
		if c.DefaultNs <= 0 || c.TunedNs <= 0 {
			s.Error = fmt.Sprintf("no time measured (default %d ns, best %d ns)", c.DefaultNs, c.TunedNs)
			continue
		}
		s.DefaultUs, s.BestUs = float64(c.DefaultNs)/1e3, float64(c.TunedNs)/1e3
		s.DefaultTF, s.BestTF = s.flopsPerRun/float64(c.DefaultNs)/1e3, s.flopsPerRun/float64(c.TunedNs)/1e3
		s.BestKernel, s.Measured, s.Rejected = c.Name, c.Measured, c.Rejected
		n := float64(s.Count)
		flops += n * s.flopsPerRun
		defNs += n * float64(c.DefaultNs)
		bestNs += n * float64(c.TunedNs)
	}
	if defNs > 0 {
		rep.DefaultTF, rep.BestTF = flops/defNs/1e3, flops/bestNs/1e3
	}
	return rep
}

// write writes the report as a table.
func (r *GEMMReport) write(w io.Writer) {
	pct := func(tf float64) float64 { return 100 * tf / r.PeakTFLOPs }
	fmt.Fprintf(w, "prefill GEMMs at %d rows (TuneGEMM: median of %d runs; %% of a %.0f TFLOP/s peak):\n", r.Rows, gemmReportReps, r.PeakTFLOPs)
	fmt.Fprintf(w, "  %-13s %-11s %5s  %10s %9s %7s  %10s %9s %7s  %s\n", "shape N×K", "kind", "count", "default µs", "TFLOP/s", "% peak", "best µs", "TFLOP/s", "% peak", "best kernel")
	for _, s := range r.Shapes {
		shape := fmt.Sprintf("%d×%d", s.N, s.K)
		if s.Error != "" {
			fmt.Fprintf(w, "  %-13s %-11s %5d  not measured: %s\n", shape, s.Kind, s.Count, s.Error)
			continue
		}
		fmt.Fprintf(w, "  %-13s %-11s %5d  %10.1f %9.4g %6.3g%%  %10.1f %9.4g %6.3g%%  %s\n", shape, s.Kind, s.Count,
			s.DefaultUs, s.DefaultTF, pct(s.DefaultTF), s.BestUs, s.BestTF, pct(s.BestTF), s.BestKernel)
	}
	fmt.Fprintf(w, "  FLOP-weighted total (each shape × its count): default %.4g TFLOP/s (%.3g%%), best %.4g TFLOP/s (%.3g%%)\n",
		r.DefaultTF, pct(r.DefaultTF), r.BestTF, pct(r.BestTF))
	fmt.Fprintf(w, "  not covered: %s\n", r.NotCovered)
}

// prefillFLOPs counts the FLOPs of one prefill run of a plan over tokens
// tokens in seqs sequences: 2 × the multiply-adds of its weight GEMMs —
// linear and linear_split (rows × N × K), linear_batched (rows × G × N ×
// K) and moe_experts (rows × the experts each token runs, routed and
// appended, × gate, up and down: 3 × I × D) — where rows are the node's
// input rows (the batch's tokens, or one row a sequence after last_rows:
// lm_head). Attention's score and value products, the KDA recurrence,
// norms and elementwise ops are not counted: the figure is the GEMM work
// the peak compares with, and the achieved rate over it a lower bound.
func prefillFLOPs(p *plan.Plan, tokens, seqs int) float64 {
	rows := func(v *ir.Value) float64 {
		switch r := v.Shape[0]; {
		case r == ir.DimT:
			return float64(tokens)
		case r == ir.DimS:
			return float64(seqs)
		case r > 0:
			return float64(r)
		}
		return 0
	}
	var flops float64
	for _, n := range p.Steps {
		switch n.Op {
		case ir.OpLinear, ir.OpLinearSplit:
			w := n.Inputs[1].Shape
			flops += 2 * rows(n.Inputs[0]) * float64(w[0]) * float64(w[1])
		case ir.OpLinearBatched:
			w := n.Inputs[1].Shape
			flops += 2 * rows(n.Inputs[0]) * float64(w[0]) * float64(w[1]) * float64(w[2])
		case ir.OpMoEExperts:
			k := float64(n.Inputs[1].Shape[1])
			g := n.Inputs[3].Shape // [E, I, D]
			flops += 2 * rows(n.Inputs[0]) * k * 3 * float64(g[1]) * float64(g[2])
		}
	}
	return flops
}

// Limits are the CPU limits bench compares its figures with and
// where they came from.
type Limits struct {
	Source string            `json:"source"`
	Limits *cpulimits.Limits `json:"limits,omitempty"`
	Error  string            `json:"error,omitempty"`
}

// quickLimits measures the CPU's limits once a process (cpulimits.Quick:
// about a second), for bench runs without --limits.
var quickLimits = sync.OnceValues(func() (*cpulimits.Limits, error) { return cpulimits.Measure(cpulimits.Quick()) })

// cpuLimits loads --limits or, without it, measures quickly.
func cpuLimits(path string) Limits {
	if path != "" {
		l, err := cpulimits.Load(path)
		if err != nil {
			return Limits{Source: "from " + path, Error: err.Error()}
		}
		if isa := cpulimits.ISA(); l.ISA != isa {
			return Limits{Source: "from " + path, Error: fmt.Sprintf("%s was measured with isa %q, this CPU runs %q: its limits are not this machine's (measure them: go run ./tools/limits)", path, l.ISA, isa)}
		}
		return Limits{Source: fmt.Sprintf("from %s (tools/limits, measured %s on %s, %d threads)", path, l.MeasuredAt, l.CPUModel, l.Threads), Limits: l}
	}
	l, err := quickLimits()
	b := Limits{Source: "measured now by bench's quick probe (internal/cpulimits.Quick, " +
		"after the series; pass --limits FILE from go run ./tools/limits for a careful measurement)", Limits: l}
	if err != nil {
		b.Error = err.Error()
	}
	return b
}

// peakFor is the compute peak (GFLOP/s) a prefill in precision compares
// with: vdpbf16ps's in bf16, the FP32 FMA's otherwise; its name, or why
// there is none.
func (b Limits) peakFor(precision string) (float64, string, string) {
	if b.Limits == nil {
		return 0, "", "no limits: " + b.Error
	}
	if precision == "bf16" {
		if b.Limits.BF16Dot == nil {
			return 0, "", "no vdpbf16ps peak: " + b.Limits.BF16DotSkipped
		}
		return b.Limits.BF16Dot.Median, "vdpbf16ps peak", ""
	}
	if b.Limits.FP32FMA == nil {
		return 0, "", "no fp32 FMA peak: " + b.Limits.FP32FMASkipped
	}
	return b.Limits.FP32FMA.Median, "fp32 FMA peak", ""
}

// prefillAgainstPeak fills a prefill series' compute fields: its GEMM
// FLOPs per run over the median run's time, against peak GFLOP/s.
func prefillAgainstPeak(r *Series, flops float64, tokens int, peak float64, name string) {
	r.GEMMFLOPs = flops
	r.AchievedGFLOPs = flops * r.TokensPerSec / float64(tokens) / 1e9
	if peak > 0 {
		r.PeakGFLOPs, r.PeakName, r.PeakFraction = peak, name, r.AchievedGFLOPs/peak
	}
}

// MemReport is bench's peak RSS against what must be resident: the
// checkpoint's bytes (its .safetensors files) plus the caches' bytes (every
// slot of the cache store), and their ratio (issue 15's target: ≤ 1.25).
type MemReport struct {
	PeakRSSMiB      float64 `json:"peak_rss_mib"`
	CheckpointBytes int64   `json:"checkpoint_bytes"`
	CacheBytes      int64   `json:"cache_bytes"`
	// Ratio is peak RSS ÷ (checkpoint + caches); 0 when the checkpoint's
	// size is unknown.
	Ratio float64 `json:"rss_ratio"`
}

func NewMemReport(peakMiB float64, checkpoint, caches int64) MemReport {
	m := MemReport{PeakRSSMiB: peakMiB, CheckpointBytes: checkpoint, CacheBytes: caches}
	if base := checkpoint + caches; checkpoint > 0 && base > 0 {
		m.Ratio = peakMiB * (1 << 20) / float64(base)
	}
	return m
}

func (m MemReport) String() string {
	s := fmt.Sprintf("peak RSS %.1f MiB", m.PeakRSSMiB)
	if m.Ratio > 0 {
		s += fmt.Sprintf(" = %.3f× (checkpoint %.1f MiB + caches %.1f MiB)", m.Ratio, float64(m.CheckpointBytes)/(1<<20), float64(m.CacheBytes)/(1<<20))
	}
	return s
}

// checkpointBytes sums the sizes of dir's .safetensors files (0 when there
// are none or one cannot be read).
func checkpointBytes(dir string) int64 {
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	var n int64
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return 0
		}
		n += st.Size()
	}
	return n
}
