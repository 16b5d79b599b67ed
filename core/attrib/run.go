package attrib

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/model"
)

// RequestResult is one request's outcome in a cell.
type RequestResult struct {
	Tokens []int32
	TTFT   time.Duration
	E2E    time.Duration
	ITL    []time.Duration
	Err    string
}

// CellResult is one (arm, cell, round) measurement's raw data.
type CellResult struct {
	Requests []RequestResult
	Wall     time.Duration
	// Counters is what the arm's programs did during the cell (device
	// backends; nil elsewhere).
	Counters *Counters
}

// Counters are a device backend's counters summed over an arm's programs.
type Counters struct {
	// Steps is the batches executed; DeviceNs their device time from CUDA
	// events (first upload to last kernel of each step).
	Steps    int64 `json:"steps"`
	DeviceNs int64 `json:"device_ns"`
	// Launches are the host's launch calls (a CUDA graph replay is one),
	// Kernels the kernels executed (counting those a replay runs);
	// HostSyncs the host's waits for the device, LengthSyncs those that were
	// sequence-length read-backs.
	Launches    int64 `json:"launches"`
	Kernels     int64 `json:"kernels"`
	HostSyncs   int64 `json:"host_syncs"`
	LengthSyncs int64 `json:"length_syncs"`
}

// PerStep is c averaged over its steps (at least one).
func (c Counters) PerStep() *PerStep {
	n := float64(max(c.Steps, 1))
	return &PerStep{Steps: c.Steps, DeviceMs: float64(c.DeviceNs) / 1e6 / n, Launches: float64(c.Launches) / n,
		Kernels: float64(c.Kernels) / n, HostSyncs: float64(c.HostSyncs) / n, LengthSyncs: float64(c.LengthSyncs) / n}
}

// Sub is c − o.
func (c Counters) Sub(o Counters) Counters {
	return Counters{Steps: c.Steps - o.Steps, DeviceNs: c.DeviceNs - o.DeviceNs, Launches: c.Launches - o.Launches,
		Kernels: c.Kernels - o.Kernels, HostSyncs: c.HostSyncs - o.HostSyncs, LengthSyncs: c.LengthSyncs - o.LengthSyncs}
}

// CounterRunner is a Runner whose arms run on a device backend that counts
// launches, syncs and device time.
type CounterRunner interface {
	// Counters returns the arm's counters so far, or false where its
	// backend has none (the CPU).
	Counters(a Arm) (Counters, bool)
}

// CountersOf sums the counters of programs on a device backend.
func CountersOf(stats []backend.DeviceStats) Counters {
	var c Counters
	for _, s := range stats {
		c.Steps += s.Runs
		c.DeviceNs += s.DeviceNs
		c.Launches += s.Launches
		c.Kernels += s.Kernels
		c.HostSyncs += s.HostSyncs
		c.LengthSyncs += s.LengthSyncs
	}
	return c
}

// ArmInfo describes a prepared arm.
type ArmInfo struct {
	ConfigHash string
	// Fired lists the passes that fired in any program the arm built.
	Fired []string
	// Failed lists the passes that FAILED in a program the arm built
	// ("name: reason", sorted): a plugin that failed its checksum, did not
	// start or returned an invalid graph. Such an arm does not run the
	// configuration it names, and the study refuses to measure it.
	Failed []string
}

// FailedPasses lists the FAILED passes of reports as ArmInfo.Failed does,
// one entry per pass (with the first of its reasons in sorted order: the
// same pass fails in every program of the arm, often with one reason
// wrapped in another).
func FailedPasses(reports []*pass.Report) []string {
	why := map[string]string{}
	for _, rep := range reports {
		for _, p := range rep.Passes {
			if p.Error != "" && (why[p.Name] == "" || p.Error < why[p.Name]) {
				why[p.Name] = p.Error
			}
		}
	}
	out := make([]string, 0, len(why))
	for name, e := range why {
		out = append(out, name+": "+e)
	}
	sort.Strings(out)
	return out
}

// Runner executes cells for arms at one level.
type Runner interface {
	// Prepare readies an arm (called once per arm before any cell).
	Prepare(ctx context.Context, a Arm) error
	// RunCell runs the requests at the given concurrency.
	RunCell(ctx context.Context, a Arm, c Cell, prompts [][]int32) (*CellResult, error)
	// Info reports the arm's configuration hash and fired passes.
	Info(a Arm) ArmInfo
	Close() error
}

// Prompts makes a workload's fixed random-token request set.
func Prompts(w Workload, vocab int) [][]int32 {
	r := rand.New(rand.NewPCG(w.Seed, uint64(w.InputLen)*1_000_003+uint64(w.Requests)))
	out := make([][]int32, w.Requests)
	for i := range out {
		p := make([]int32, w.InputLen)
		for j := range p {
			p[j] = int32(1 + r.IntN(vocab-1))
		}
		out[i] = p
	}
	return out
}

// Generate streams one greedy request; onTokens is called whenever tokens
// arrive (with how many arrived).
type Generate func(ctx context.Context, prompt []int32, maxTokens int, onTokens func(toks []int32)) error

// Drive runs prompts at a concurrency through gen, timing every request.
func Drive(ctx context.Context, gen Generate, prompts [][]int32, maxTokens, conc int) *CellResult {
	res := &CellResult{Requests: make([]RequestResult, len(prompts))}
	var next int
	var mu sync.Mutex
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= len(prompts) {
					return
				}
				rr := &res.Requests[i]
				t0 := time.Now()
				last := t0
				err := gen(ctx, prompts[i], maxTokens, func(toks []int32) {
					now := time.Now()
					if len(rr.Tokens) == 0 {
						rr.TTFT = now.Sub(t0)
					} else {
						rr.ITL = append(rr.ITL, now.Sub(last))
					}
					for range toks[1:] {
						rr.ITL = append(rr.ITL, 0)
					}
					last = now
					rr.Tokens = append(rr.Tokens, toks...)
				})
				rr.E2E = time.Since(t0)
				if err != nil {
					rr.Err = err.Error()
				}
			}
		}()
	}
	wg.Wait()
	res.Wall = time.Since(start)
	return res
}

// ConfigHash is a short stable hash of an arm's engine configuration.
func ConfigHash(m ModelRef, ps []config.PassConfig) string {
	b, _ := json.Marshal(struct {
		M ModelRef
		P []config.PassConfig
	}{m, ps})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:6])
}

// PipelineFunc builds an arm's pass pipeline (the CLI adds plugin passes).
type PipelineFunc func(e *config.Config) (*pass.Pipeline, error)

// builtinPipeline is the default PipelineFunc: the built-in passes only.
func builtinPipeline(e *config.Config) (*pass.Pipeline, error) { return e.Pipeline(nil) }

// EngineRunner runs arms in process: one engine (sharing the weights) and
// one continuous-batching runtime per arm.
type EngineRunner struct {
	Model    *model.Config
	Weights  plan.Weights
	Info_    pass.WeightInfo
	Study    *Study
	Pipeline PipelineFunc
	// Base is the configuration every arm starts from (nil: the built-in
	// one): the arm replaces its passes, the study sets its device,
	// precision and CUDA section (Study.EngineConfig); an arm's engine is
	// what that configuration says (engine.FromConfig).
	Base *config.Config
	arms map[string]*engineArm
}

type engineArm struct {
	eng *engine.Engine
	rt  *sched.Scheduler
}

// NewEngineRunner prepares an in-process runner; weights are loaded once
// and shared by every arm.
func NewEngineRunner(s *Study, cfg *model.Config, w plan.Weights, wi pass.WeightInfo, pf PipelineFunc) *EngineRunner {
	if pf == nil {
		pf = builtinPipeline
	}
	return &EngineRunner{Model: cfg, Weights: plan.NewWeightCache(w), Info_: wi, Study: s, Pipeline: pf, arms: map[string]*engineArm{}}
}

func maxConcurrency(s *Study) (conc, reqs int) {
	for _, w := range s.Workloads {
		for _, c := range w.Concurrency {
			conc = max(conc, c)
		}
		reqs = max(reqs, w.Requests)
	}
	return
}

// Prepare implements Runner.
func (r *EngineRunner) Prepare(ctx context.Context, a Arm) error {
	ec := r.Study.EngineConfig(r.Base, a)
	pl, err := r.Pipeline(ec)
	if err != nil {
		return fmt.Errorf("arm %s: %w", a.Name, err)
	}
	if err := ec.CheckModel(r.Model); err != nil {
		return fmt.Errorf("arm %s: %w", a.Name, err)
	}
	conc, reqs := maxConcurrency(r.Study)
	// a device store is allocated for every slot at its full length: size
	// it for the study's longest request, not the model's context
	eng, err := engine.New(r.Model, r.Weights, engine.FromConfig(ec, engine.Setup{Model: r.Model, Weights: r.Info_, Pipeline: pl, Slots: conc,
		MaxPositions: r.Study.MaxPositions(r.Model.MaxPositionEmbeddings)}))
	if err != nil {
		return err
	}
	for _, key := range sched.Programs { // compiled here, never during a measurement
		if _, err := eng.Program(key); err != nil {
			return fmt.Errorf("arm %s: %w", a.Name, err)
		}
	}
	rt, err := sched.New(eng, sched.Config{MaxRunning: conc, MaxQueue: reqs, MaxBatchTokens: r.Study.Runtime.MaxBatchTokens, PrefillChunk: r.Study.Runtime.PrefillChunk,
		ContextLimit: max(2, r.Study.MaxPositions(r.Model.MaxPositionEmbeddings))}, sched.Options{})
	if err != nil {
		return err
	}
	r.arms[a.Name] = &engineArm{eng: eng, rt: rt}
	return nil
}

// RunCell implements Runner.
func (r *EngineRunner) RunCell(ctx context.Context, a Arm, c Cell, prompts [][]int32) (*CellResult, error) {
	ea := r.arms[a.Name]
	gen := func(ctx context.Context, prompt []int32, maxTokens int, on func([]int32)) error {
		h, err := ea.rt.Submit(ctx, sched.Request{Prompt: prompt, MaxTokens: maxTokens, Sampling: sample.Greedy(), IgnoreEOS: true})
		if err != nil {
			return err
		}
		for {
			toks, fin, err := h.Recv(ctx)
			if err != nil {
				return err
			}
			if len(toks) > 0 {
				ids := make([]int32, len(toks))
				for i, t := range toks {
					ids[i] = t.ID
				}
				on(ids)
			}
			if fin != nil {
				if fin.Reason != sched.FinishLength && fin.Reason != sched.FinishStop {
					return fmt.Errorf("request ended with %s: %s", fin.Reason, fin.Message)
				}
				return nil
			}
		}
	}
	return Drive(ctx, gen, prompts, c.Workload.OutputLen, c.Concurrency), nil
}

// DeviceInfo names the arms' backend and device ("cuda: NVIDIA H200 (…)").
func (r *EngineRunner) DeviceInfo() string {
	for _, a := range r.arms {
		in := a.eng.Backend().Info()
		return in.Backend + ": " + in.Device
	}
	return ""
}

// Counters implements CounterRunner: the sums over the arm's programs,
// on device backends.
func (r *EngineRunner) Counters(a Arm) (Counters, bool) {
	ea := r.arms[a.Name]
	if ea == nil || ea.eng.Backend().Name() == "cpu" {
		return Counters{}, false
	}
	var stats []backend.DeviceStats
	for _, p := range ea.eng.Programs() {
		stats = append(stats, backend.DeviceStatsOf(p))
	}
	return CountersOf(stats), true
}

// Info implements Runner.
func (r *EngineRunner) Info(a Arm) ArmInfo {
	info := ArmInfo{ConfigHash: ConfigHash(r.Study.Model, a.Passes)}
	ea := r.arms[a.Name]
	if ea == nil {
		return info
	}
	set := map[string]bool{}
	var reps []*pass.Report
	for _, rep := range ea.eng.Reports() {
		reps = append(reps, rep)
		for _, p := range rep.FiredPasses() {
			set[p] = true
		}
	}
	info.Failed = FailedPasses(reps)
	for p := range set {
		info.Fired = append(info.Fired, p)
	}
	sort.Strings(info.Fired)
	return info
}

// Close implements Runner.
func (r *EngineRunner) Close() error {
	var errs []error
	for _, a := range r.arms {
		a.rt.Close()
		errs = append(errs, a.eng.Close())
	}
	return errors.Join(errs...)
}
