package attrib

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/model"
)

// A pass micro-benchmark measures each pass on and off, interleaved, on
// the engine's own steps (no scheduler): a prefill of one prompt and decode
// steps at a few batch sizes, per step the wall time, the device time
// (CUDA events), launches, kernels, host syncs and length read-backs. "Off"
// is the reference: no passes (Against "baseline": the pass alone against
// none), or every pass of the configuration (Against "all": all of them
// against all but this one).

// PassBench configures a micro-benchmark.
type PassBench struct {
	Model   *model.Config
	Weights plan.Weights
	Info    pass.WeightInfo
	// Base is the configuration (nil: the built-in one): its device,
	// precision and CUDA section choose the backend (engine.FromConfig),
	// its passes are "all"; Pipeline builds a pass list's pipeline (nil:
	// the built-in passes only).
	Base     *config.Config
	Pipeline PipelineFunc
	// Passes are measured one by one (nil: Base's enabled passes).
	Passes []config.PassConfig
	// Against is "baseline" (default) or "all".
	Against string
	// Prompt is the prefill's length; Batches the decode batch sizes, each
	// measured over Steps steps after a 32-token prefill of every sequence;
	// Rounds measured rounds after Warmup.
	Prompt, Steps, Rounds, Warmup int
	Batches                       []int
	// Progress is told what runs.
	Progress func(string)
}

// PhaseStats are one arm's medians over rounds, per step.
type PhaseStats struct {
	WallMs      float64  `json:"wall_ms"`
	DeviceMs    *float64 `json:"device_ms,omitempty"`
	Launches    *float64 `json:"launches,omitempty"`
	Kernels     *float64 `json:"kernels,omitempty"`
	HostSyncs   *float64 `json:"host_syncs,omitempty"`
	LengthSyncs *float64 `json:"length_syncs,omitempty"`
}

// PassBenchRow is one phase of one pass: off and on, and the speed-up
// off/on of the time per step with its 95% interval (paired rounds), by
// wall clock and by device time.
type PassBenchRow struct {
	Phase   string     `json:"phase"`
	Off     PhaseStats `json:"off"`
	On      PhaseStats `json:"on"`
	Speedup Interval   `json:"speedup"`
	// DeviceSpeedup is by device time (device backends).
	DeviceSpeedup *Interval `json:"device_speedup,omitempty"`
}

// PassBenchResult is one pass's rows.
type PassBenchResult struct {
	Pass    string         `json:"pass"`
	Against string         `json:"against"`
	Fired   bool           `json:"fired"`
	Rounds  int            `json:"rounds"`
	Rows    []PassBenchRow `json:"rows"`
}

// phaseSample is one measurement of one phase on one arm.
type phaseSample struct {
	wallMs float64
	c      *Counters
}

type benchArm struct {
	eng   *engine.Engine
	fired bool
}

// Run measures every pass and returns one result per pass.
func (pb *PassBench) Run(ctx context.Context) ([]PassBenchResult, error) {
	if pb.Against == "" {
		pb.Against = "baseline"
	}
	if pb.Against != "baseline" && pb.Against != "all" {
		return nil, fmt.Errorf("against: baseline or all, got %q", pb.Against)
	}
	if pb.Prompt < 1 || pb.Steps < 1 || pb.Rounds < 1 || pb.Warmup < 0 || len(pb.Batches) == 0 {
		return nil, fmt.Errorf("a pass benchmark needs a prompt, steps, rounds ≥ 1, warmup ≥ 0 and batch sizes")
	}
	if pb.Prompt > pb.Model.MaxPositionEmbeddings || 32+pb.Steps > pb.Model.MaxPositionEmbeddings {
		return nil, fmt.Errorf("the prompt (%d) and 32 + the decode steps must fit the model's %d positions", pb.Prompt, pb.Model.MaxPositionEmbeddings)
	}
	base := pb.Base
	if base == nil {
		base = config.Default()
	}
	passes := pb.Passes
	if passes == nil {
		passes = base.Enabled()
	}
	if pb.Pipeline == nil {
		pb.Pipeline = builtinPipeline
	}
	slots := 1
	for _, b := range pb.Batches {
		slots = max(slots, b)
	}
	weights := plan.NewWeightCache(pb.Weights)
	var engines []*engine.Engine
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()
	newArm := func(ps []config.PassConfig) (*benchArm, error) {
		ec := *base
		ec.Passes = ps
		pl, err := pb.Pipeline(&ec)
		if err != nil {
			return nil, err
		}
		e, err := engine.New(pb.Model, weights, engine.FromConfig(&ec, engine.Setup{Model: pb.Model, Weights: pb.Info, Pipeline: pl, Slots: slots,
			MaxPositions: max(pb.Prompt, 32+pb.Steps)})) // a device store holds every slot at full length
		if err != nil {
			return nil, err
		}
		engines = append(engines, e)
		for _, k := range []engine.Key{{Mode: graph.Prefill, Logits: graph.LastLogits}, {Mode: graph.Decode, Logits: graph.LastLogits}} {
			if _, err := e.Program(k); err != nil {
				return nil, err
			}
		}
		return &benchArm{eng: e}, nil
	}
	var ref *benchArm
	var err error
	if pb.Against == "baseline" {
		ref, err = newArm(nil)
	} else {
		ref, err = newArm(passes)
	}
	if err != nil {
		return nil, fmt.Errorf("reference arm: %w", err)
	}
	arms := make([]*benchArm, len(passes))
	for i, p := range passes {
		ps := []config.PassConfig{p}
		if pb.Against == "all" {
			ps = nil
			for _, q := range passes {
				if q.Name != p.Name {
					ps = append(ps, q)
				}
			}
		}
		if arms[i], err = newArm(ps); err != nil {
			return nil, fmt.Errorf("pass %s: %w", p.Name, err)
		}
		subject := arms[i]
		if pb.Against == "all" {
			subject = ref
		}
		for _, rep := range subject.eng.Reports() {
			if slices.Contains(rep.FiredPasses(), p.Name) {
				arms[i].fired = true
			}
		}
	}
	phases := []string{fmt.Sprintf("prefill %d", pb.Prompt)}
	for _, b := range pb.Batches {
		phases = append(phases, fmt.Sprintf("decode b%d", b))
	}
	// samples[pass][phase] = per round (off, on)
	samples := make([][][][2]phaseSample, len(passes))
	for i := range samples {
		samples[i] = make([][][2]phaseSample, len(phases))
	}
	for round := 0; round < pb.Warmup+pb.Rounds; round++ {
		for i, p := range passes {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if pb.Progress != nil {
				pb.Progress(fmt.Sprintf("round %d/%d %s", round+1, pb.Warmup+pb.Rounds, p.Name))
			}
			// the pass's arm is "on" against "baseline", "off" against "all"
			off, on := ref, arms[i]
			if pb.Against == "all" {
				off, on = arms[i], ref
			}
			order := []*benchArm{off, on}
			if round%2 == 1 {
				order = []*benchArm{on, off}
			}
			for ph := range phases {
				var pair [2]phaseSample
				for _, a := range order {
					s, err := pb.phase(a.eng, ph, round)
					if err != nil {
						return nil, fmt.Errorf("pass %s, %s: %w", p.Name, phases[ph], err)
					}
					if a == off {
						pair[0] = s
					} else {
						pair[1] = s
					}
				}
				if round >= pb.Warmup {
					samples[i][ph] = append(samples[i][ph], pair)
				}
			}
		}
	}
	var out []PassBenchResult
	for i, p := range passes {
		res := PassBenchResult{Pass: p.Name, Against: pb.Against, Fired: arms[i].fired, Rounds: pb.Rounds}
		for ph, name := range phases {
			ss := samples[i][ph]
			row := PassBenchRow{Phase: name, Off: medians(ss, 0), On: medians(ss, 1)}
			var offW, onW, offD, onD []float64
			for _, s := range ss {
				offW, onW = append(offW, s[0].wallMs), append(onW, s[1].wallMs)
				if s[0].c != nil && s[1].c != nil && s[0].c.DeviceNs > 0 && s[1].c.DeviceNs > 0 {
					offD, onD = append(offD, float64(s[0].c.DeviceNs)), append(onD, float64(s[1].c.DeviceNs))
				}
			}
			row.Speedup = PairedInterval(LogRatios(offW, onW), Seed("passbench", p.Name, name, MetricWall))
			if len(offD) == len(ss) && len(ss) > 0 {
				iv := PairedInterval(LogRatios(offD, onD), Seed("passbench", p.Name, name, MetricDevice))
				row.DeviceSpeedup = &iv
			}
			res.Rows = append(res.Rows, row)
		}
		out = append(out, res)
	}
	return out, nil
}

func medians(ss [][2]phaseSample, side int) PhaseStats {
	pick := func(f func(phaseSample) float64) float64 {
		var xs []float64
		for _, s := range ss {
			xs = append(xs, f(s[side]))
		}
		return stat(xs).Median
	}
	ps := PhaseStats{WallMs: pick(func(s phaseSample) float64 { return s.wallMs })}
	for _, s := range ss {
		if s[side].c == nil {
			return ps
		}
	}
	var per []*PerStep
	for _, s := range ss {
		per = append(per, s[side].c.PerStep())
	}
	m := medianPerStep(per)
	ps.DeviceMs, ps.Launches, ps.Kernels, ps.HostSyncs, ps.LengthSyncs = &m.DeviceMs, &m.Launches, &m.Kernels, &m.HostSyncs, &m.LengthSyncs
	return ps
}

// counters sums the device counters of an engine's programs (nil on the
// CPU).
func counters(e *engine.Engine, key engine.Key) (*Counters, error) {
	if e.Backend().Name() == "cpu" {
		return nil, nil
	}
	p, err := e.Program(key)
	if err != nil {
		return nil, err
	}
	c := CountersOf([]backend.DeviceStats{backend.DeviceStatsOf(p)})
	return &c, nil
}

// phase runs one phase on an engine: the prefill (timed), or the decode
// steps of one batch size (after an untimed prefill of every sequence).
func (pb *PassBench) phase(e *engine.Engine, ph, round int) (phaseSample, error) {
	V := pb.Model.VocabSize
	store := e.Store()
	var slots []int
	defer func() {
		for _, s := range slots {
			_ = store.Free(s) // allocated here: freeing cannot fail
		}
	}()
	alloc := func(n int) error {
		for range n {
			s, err := store.Alloc()
			if err != nil {
				return err
			}
			slots = append(slots, s)
		}
		return nil
	}
	measure := func(key engine.Key, steps int, run func(step int) error) (phaseSample, error) {
		c0, err := counters(e, key)
		if err != nil {
			return phaseSample{}, err
		}
		t0 := time.Now()
		for st := range steps {
			if err := run(st); err != nil {
				return phaseSample{}, err
			}
		}
		s := phaseSample{wallMs: float64(time.Since(t0).Microseconds()) / 1000 / float64(steps)}
		c1, err := counters(e, key)
		if err != nil {
			return phaseSample{}, err
		}
		if c0 != nil {
			d := c1.Sub(*c0)
			s.c = &d
		}
		return s, nil
	}
	prefill := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	if ph == 0 {
		if err := alloc(1); err != nil {
			return phaseSample{}, err
		}
		return measure(prefill, 1, func(int) error {
			_, err := e.Run(prefill, &backend.Batch{Seqs: []backend.Seq{{Slot: slots[0], Tokens: BenchTokens(pb.Prompt, round+1, V)}}})
			return err
		})
	}
	B := pb.Batches[ph-1]
	if err := alloc(B); err != nil {
		return phaseSample{}, err
	}
	if err := PrefillSlots(e, slots, V); err != nil {
		return phaseSample{}, err
	}
	specs := GreedySpecs(B)
	return measure(DecodeKey, pb.Steps, func(st int) error { return DecodeStep(e, slots, specs, st, V) })
}

// WritePassBench prints the results: per pass and phase, off → on of the
// time per step (wall and device), the speed-up with its interval, and the
// counters per step ("n/a" where the backend has none).
func WritePassBench(w io.Writer, rs []PassBenchResult) error {
	if len(rs) == 0 {
		return errors.New("no passes measured")
	}
	f := func(v *float64, prec int) string {
		if v == nil {
			return "n/a"
		}
		return fmt.Sprintf("%.*f", prec, *v)
	}
	for _, r := range rs {
		ref := "no passes"
		if r.Against == "all" {
			ref = "every pass, against every pass but this one"
		}
		fired := ""
		if !r.Fired {
			fired = " — IT FIRED NOWHERE: both arms run the same graph"
		}
		fmt.Fprintf(w, "\n%s (off: %s; %d paired rounds)%s\n", r.Pass, ref, r.Rounds, fired)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "phase\twall ms/step off → on\tspeed-up [95%]\tdevice ms/step off → on\tdevice speed-up\tlaunches\tkernels\thost syncs\tlength syncs")
		for _, row := range r.Rows {
			ds := "n/a"
			if row.DeviceSpeedup != nil {
				ds = ratioString(*row.DeviceSpeedup)
			}
			fmt.Fprintf(tw, "%s\t%.3f → %.3f\t%s\t%s → %s\t%s\t%s → %s\t%s → %s\t%s → %s\t%s → %s\n", row.Phase, row.Off.WallMs, row.On.WallMs, ratioString(row.Speedup),
				f(row.Off.DeviceMs, 3), f(row.On.DeviceMs, 3), ds, f(row.Off.Launches, 0), f(row.On.Launches, 0), f(row.Off.Kernels, 0), f(row.On.Kernels, 0),
				f(row.Off.HostSyncs, 1), f(row.On.HostSyncs, 1), f(row.Off.LengthSyncs, 1), f(row.On.LengthSyncs, 1))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// ratioString is "1.042× [1.031, 1.055]" (a tie marked).
func ratioString(iv Interval) string {
	if !iv.Defined() {
		return fmt.Sprintf("%.3f× (%s)", iv.Ratio, VerdictTooFew)
	}
	s := fmt.Sprintf("%.3f× [%.3f, %.3f]", iv.Ratio, iv.Lo, iv.Hi)
	if iv.Tie() {
		s += " tie"
	}
	return s
}
