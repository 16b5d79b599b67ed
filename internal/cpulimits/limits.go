// Package cpulimits measures the limits of the CPU a benchmark runs on:
// the FP32 FMA peak (VFMADD231PS on zmm registers with AVX-512, on ymm with
// AVX2 + FMA), the VDPBF16PS peak (when the CPU has AVX512_BF16) and the
// read bandwidth from memory (64- or 32-byte loads), each on every
// CPU the process may run on, with one goroutine per CPU locked to its OS
// thread and that thread pinned to the CPU.
//
// The kernels are Go assembly (the compiler cannot fold or drop them):
// the compute kernels keep independent accumulator chains in registers
// and store every accumulator; the read kernel sums a buffer of at least
// four times the last-level cache with vector loads and stores its sums.
// Every stored result is checked against its closed form, so a kernel
// that did not do its work fails the measurement instead of reporting a
// fast figure. Each limit is the median of several runs, with its spread.
//
// tools/limits is the command around it; glmflash bench reads its JSON
// (--limits) or measures quickly itself.
package cpulimits

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Format is the JSON format's name, written in every Limits.
const Format = "glmflash-cpu-limits/1"

// Options set how long and on how many CPUs the probe measures.
type Options struct {
	// Threads is the number of CPUs measured on (0: every CPU the process
	// may run on, runtime.NumCPU()).
	Threads int
	// Runs is the number of timed runs per limit (the median is reported).
	Runs int
	// RunTime is the target duration of one compute run.
	RunTime time.Duration
	// ReadPasses is the number of times one bandwidth run reads the whole
	// buffer.
	ReadPasses int
	// BufferBytes is the read buffer's size (0: 4 × the last-level cache,
	// at least 128 MiB).
	BufferBytes int64
}

// Full is the options of a careful measurement (tools/limits).
func Full() Options {
	return Options{Runs: 7, RunTime: 300 * time.Millisecond, ReadPasses: 4}
}

// Quick is the options of a short measurement (about a second; glmflash
// bench without --limits).
func Quick() Options {
	return Options{Runs: 3, RunTime: 40 * time.Millisecond, ReadPasses: 1}
}

// Stat is one limit: the median of the runs, their minimum and maximum,
// and the runs in order; CPUShare is, per run, the CPU time the measuring
// threads got over threads × wall time (1: they had their CPUs to
// themselves; lower: other processes took a share and the figure is low
// by about as much; absent where the OS does not report thread CPU time).
type Stat struct {
	Median   float64   `json:"median"`
	Min      float64   `json:"min"`
	Max      float64   `json:"max"`
	Runs     []float64 `json:"runs"`
	CPUShare []float64 `json:"cpu_share,omitempty"`
}

// MedianShare is the median of CPUShare (0 when not measured).
func (s *Stat) MedianShare() float64 {
	if s == nil || len(s.CPUShare) == 0 {
		return 0
	}
	v := append([]float64(nil), s.CPUShare...)
	sort.Float64s(v)
	return v[len(v)/2]
}

// Spread is (max − min) / median: the runs' relative spread.
func (s *Stat) Spread() float64 {
	if s == nil || s.Median == 0 {
		return 0
	}
	return (s.Max - s.Min) / s.Median
}

func newStat(runs, shares []float64) *Stat {
	s := append([]float64(nil), runs...)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	st := &Stat{Median: m, Min: s[0], Max: s[len(s)-1], Runs: runs}
	for _, v := range shares {
		if v <= 0 {
			return st
		}
	}
	st.CPUShare = shares
	return st
}

// Limits is what the probe measured (the JSON tools/limits writes and
// glmflash bench --limits reads).
type Limits struct {
	Format    string `json:"format"`
	Host      string `json:"host"`
	CPUModel  string `json:"cpu_model"`
	GOARCH    string `json:"goarch"`
	GoVersion string `json:"go_version"`
	Threads   int    `json:"threads"`
	// ISA is the vector instruction set the kernels ran ("avx512", "avx2"):
	// part of the file's key (Slug), since one CPU model name can come with
	// or without AVX-512 (virtual machines mask it).
	ISA        string `json:"isa"`
	MeasuredAt string `json:"measured_at"`
	// Method says how each figure was measured.
	Method string `json:"method"`
	// FP32FMA is the VFMADD231PS peak in GFLOP/s (an FMA is 2 FLOPs a
	// lane) on the ISA's widest registers; nil when it could not run
	// (FP32FMASkipped says why).
	FP32FMA        *Stat  `json:"fp32_fma_gflops,omitempty"`
	FP32FMASkipped string `json:"fp32_fma_skipped,omitempty"`
	// BF16Dot is the VDPBF16PS peak in GFLOP/s (2 products and 2 adds a
	// fp32 lane: 64 FLOPs an instruction); nil without AVX512_BF16.
	BF16Dot        *Stat  `json:"bf16_dot_gflops,omitempty"`
	BF16DotSkipped string `json:"bf16_dot_skipped,omitempty"`
	// ReadBandwidth is the read bandwidth in GB/s (10⁹ bytes a second) of
	// ReadBufferBytes summed ReadPasses times a run; LLCBytes the
	// last-level cache it was sized from.
	ReadBandwidth        *Stat  `json:"read_bandwidth_gbs,omitempty"`
	ReadBandwidthSkipped string `json:"read_bandwidth_skipped,omitempty"`
	ReadBufferBytes      int64  `json:"read_buffer_bytes,omitempty"`
	LLCBytes             int64  `json:"llc_bytes,omitempty"`
}

// Measure runs the probe with o's settings (zero fields take Full's).
func Measure(o Options) (*Limits, error) {
	f := Full()
	if o.Runs <= 0 {
		o.Runs = f.Runs
	}
	if o.RunTime <= 0 {
		o.RunTime = f.RunTime
	}
	if o.ReadPasses <= 0 {
		o.ReadPasses = f.ReadPasses
	}
	if o.Threads <= 0 {
		o.Threads = runtime.NumCPU()
	}
	host, _ := os.Hostname()
	fma, fmaWhy := fmaProbe()
	read, readWhat, readWhy := readProbe()
	l := &Limits{Format: Format, Host: host, CPUModel: CPUModel(), GOARCH: runtime.GOARCH, GoVersion: runtime.Version(),
		Threads: o.Threads, ISA: ISA(), MeasuredAt: time.Now().UTC().Format(time.RFC3339)}
	method := []string{fmt.Sprintf("%d goroutines locked to OS threads pinned one per CPU; median of %d runs each; isa %q", o.Threads, o.Runs, l.ISA)}
	var err error
	if fmaWhy == "" {
		method = append(method, "fp32: "+fma.what)
		if l.FP32FMA, err = compute(o, fma, 2, 1.0/(1<<20)); err != nil {
			return nil, fmt.Errorf("fp32 FMA: %w", err)
		}
	} else {
		l.FP32FMASkipped = fmaWhy
	}
	if ok, why := haveBF16(); ok {
		method = append(method, fmt.Sprintf("bf16: %d independent VDPBF16PS zmm chains (4 FLOPs a fp32 lane)", accumulators))
		bf := probe{run: bf16Kernel, lanes: accumulators * 16, vw: 16}
		if l.BF16Dot, err = compute(o, bf, 4, 2.0/(1<<20)); err != nil {
			return nil, fmt.Errorf("bf16 dot: %w", err)
		}
	} else {
		l.BF16DotSkipped = why
	}
	if readWhy == "" {
		l.LLCBytes = LLCBytes()
		size := o.BufferBytes
		if size <= 0 {
			size = max(4*l.LLCBytes, 128<<20)
		}
		l.ReadBufferBytes = size
		method = append(method, fmt.Sprintf("read: %s over a buffer of ≥ 4× the LLC split between the threads, %d pass(es) a run", readWhat, o.ReadPasses))
		if l.ReadBandwidth, err = bandwidth(o, read, size); err != nil {
			return nil, fmt.Errorf("read bandwidth: %w", err)
		}
	} else {
		l.ReadBandwidthSkipped = readWhy
	}
	l.Method = strings.Join(method, "; ") + "; every stored result checked"
	return l, nil
}

// maxIters bounds one kernel call: the accumulators stay exact (below
// 2²³ increments of a power of two).
const maxIters = 1 << 22

// probe is a compute kernel (iters iterations, its first lanes elements of
// out stored: accumulators of vw lanes) and what it runs.
type probe struct {
	run       func(iters int, out *[accumulators * 16]float32)
	lanes, vw int
	what      string
}

// compute measures a compute kernel doing flopsPerLane FLOPs per lane an
// iteration, each lane growing by step an iteration: calibrates the
// iterations of a RunTime run on one thread, then times o.Runs runs on
// every thread at once (GFLOP/s of all threads' work over the wall time
// from the common start to the last thread's end).
func compute(o Options, k probe, flopsPerLane int, step float64) (*Stat, error) {
	flopsPerIter := flopsPerLane * k.lanes
	call := func(iters int, out *[accumulators * 16]float32) error {
		k.run(iters, out)
		want := float32(float64(iters) * step)
		for i, v := range out[:k.lanes] {
			if v != want {
				return fmt.Errorf("accumulator %d lane %d holds %v after %d iterations, want %v: the kernel did not do its work", i/k.vw, i%k.vw, v, iters, want)
			}
		}
		return nil
	}
	// calibrate: iterations a second on this thread
	var out [accumulators * 16]float32
	iters := 1 << 14
	var perSec float64
	for {
		t0 := time.Now()
		if err := call(iters, &out); err != nil {
			return nil, err
		}
		d := time.Since(t0)
		if d > 5*time.Millisecond || iters >= maxIters {
			perSec = float64(iters) / d.Seconds()
			break
		}
		iters *= 4
	}
	total := max(int(perSec*o.RunTime.Seconds()), 1)
	var runs, shares []float64
	for r := 0; r < o.Runs; r++ {
		secs, share, err := parallel(o.Threads, func(int) error {
			var out [accumulators * 16]float32
			for left := total; left > 0; left -= maxIters {
				if err := call(min(left, maxIters), &out); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		runs = append(runs, float64(o.Threads)*float64(total)*float64(flopsPerIter)/secs/1e9)
		shares = append(shares, share)
	}
	return newStat(runs, shares), nil
}

// bandwidth measures reading a size-byte buffer, split in equal parts
// between the threads (each fills its own part first, so its pages are
// local), ReadPasses times a run: GB/s over the wall time.
func bandwidth(o Options, readKernel func(p *uint64, n int, out *[8]uint64), size int64) (*Stat, error) {
	part := size / int64(o.Threads) / 512 * 512
	if part <= 0 {
		return nil, fmt.Errorf("a %d-byte buffer cannot be split between %d threads", size, o.Threads)
	}
	words := part / 8
	buf := make([]uint64, words*int64(o.Threads))
	if _, _, err := parallel(o.Threads, func(t int) error {
		p := buf[int64(t)*words : int64(t+1)*words]
		for i := range p {
			p[i] = uint64(int64(t)*words + int64(i))
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var runs, shares []float64
	for r := 0; r < o.Runs; r++ {
		secs, share, err := parallel(o.Threads, func(t int) error {
			p := buf[int64(t)*words : int64(t+1)*words]
			// Σ i over [a, b): the words' closed form (mod 2⁶⁴)
			a, b := uint64(int64(t)*words), uint64(int64(t+1)*words)
			want := (b - a) * (a + b - 1) / 2
			var out [8]uint64
			for pass := 0; pass < o.ReadPasses; pass++ {
				readKernel(&p[0], int(part), &out)
				var got uint64
				for _, v := range out {
					got += v
				}
				if got != want {
					return fmt.Errorf("thread %d summed %d, want %d: the kernel did not read its part", t, got, want)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		runs = append(runs, float64(part)*float64(o.Threads)*float64(o.ReadPasses)/secs/1e9)
		shares = append(shares, share)
	}
	runtime.KeepAlive(buf)
	return newStat(runs, shares), nil
}

// parallel runs f(0..n−1) on n goroutines, each locked to its OS thread
// and the thread pinned to one CPU (where the OS allows), all starting
// together once every one is ready; it returns the seconds from the start
// to the last one's end and the CPU time the threads got over n × those
// seconds (0 where unknown). The pinned threads exit with their goroutines
// (a locked goroutine that returns without unlocking takes its thread
// along), so no other goroutine inherits a pinning.
func parallel(n int, f func(i int) error) (float64, float64, error) {
	cpus := allowedCPUs()
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	cpu := make([]float64, n)
	ready.Add(n)
	done.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer done.Done()
			runtime.LockOSThread() // not unlocked: the thread exits with the goroutine
			if len(cpus) > 0 {
				pin(cpus[i%len(cpus)])
			}
			ready.Done()
			<-start
			c0 := threadCPUSeconds()
			errs[i] = f(i)
			cpu[i] = threadCPUSeconds() - c0
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	done.Wait()
	secs := time.Since(t0).Seconds()
	var used float64
	for i, err := range errs {
		if err != nil {
			return 0, 0, err
		}
		used += cpu[i]
	}
	return secs, used / float64(n) / secs, nil
}

// CPUModel is the CPU's model name from /proc/cpuinfo ("" when unknown).
func CPUModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// LLCBytes is the largest cache level's size CPU 0 reports in sysfs (32
// MiB when unknown).
func LLCBytes() int64 {
	best := int64(0)
	for i := 0; i < 8; i++ {
		b, err := os.ReadFile(fmt.Sprintf("/sys/devices/system/cpu/cpu0/cache/index%d/size", i))
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		mult := int64(1)
		switch {
		case strings.HasSuffix(s, "K"):
			mult, s = 1<<10, strings.TrimSuffix(s, "K")
		case strings.HasSuffix(s, "M"):
			mult, s = 1<<20, strings.TrimSuffix(s, "M")
		}
		if v, err := strconv.ParseInt(s, 10, 64); err == nil {
			best = max(best, v*mult)
		}
	}
	if best == 0 {
		return 32 << 20
	}
	return best
}

// Load reads a Limits JSON (tools/limits' output) and checks it is one
// with a positive FP32 FMA peak and read bandwidth.
func Load(path string) (*Limits, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var l Limits
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if l.Format != Format {
		return nil, fmt.Errorf("%s: format %q, want %q (tools/limits' output)", path, l.Format, Format)
	}
	if l.ISA == "" {
		return nil, fmt.Errorf("%s: isa is missing: the file predates the instruction set's key; measure again (go run ./tools/limits)", path)
	}
	for _, s := range []struct {
		name string
		st   *Stat
		opt  bool
	}{{"fp32_fma_gflops", l.FP32FMA, false}, {"bf16_dot_gflops", l.BF16Dot, true}, {"read_bandwidth_gbs", l.ReadBandwidth, false}} {
		if s.st == nil && s.opt {
			continue
		}
		if s.st == nil || !(s.st.Median > 0) {
			return nil, fmt.Errorf("%s: %s must be measured and positive", path, s.name)
		}
	}
	return &l, nil
}

// Save writes l as indented JSON.
func (l *Limits) Save(path string) error {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Slug is a file name for l's machine: the CPU model (else the host), the
// ISA and the thread count, lower case, runs of other characters as one '-'
// ("amd-epyc-avx2-2t").
func (l *Limits) Slug() string {
	name := l.CPUModel
	if name == "" {
		name = l.Host
	}
	if l.ISA != "" {
		name += " " + l.ISA
	}
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-") + fmt.Sprintf("-%dt", l.Threads)
}

// String is a one-line summary: each limit's median and spread.
func (l *Limits) String() string {
	f := func(name, unit string, s *Stat, skipped string) string {
		if s == nil {
			return fmt.Sprintf("%s skipped (%s)", name, skipped)
		}
		share := ""
		if sh := s.MedianShare(); sh > 0 {
			share = fmt.Sprintf(", CPU share %.0f%%", 100*sh)
		}
		return fmt.Sprintf("%s %.1f %s (runs %.1f–%.1f, spread %.1f%%%s)", name, s.Median, unit, s.Min, s.Max, 100*s.Spread(), share)
	}
	return fmt.Sprintf("isa %s: %s; %s; %s", cmp.Or(l.ISA, "none"), f("fp32 FMA", "GFLOP/s", l.FP32FMA, l.FP32FMASkipped), f("vdpbf16ps", "GFLOP/s", l.BF16Dot, l.BF16DotSkipped),
		f("read", "GB/s", l.ReadBandwidth, l.ReadBandwidthSkipped))
}
