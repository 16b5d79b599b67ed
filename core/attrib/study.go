// Package attrib runs attribution studies: which pass buys how much, on
// which workload. A study names a model, workloads (fixed random-token
// request sets), arms (baseline, all on, leave-one-out, add-one-in, explicit
// pass lists), repetitions and a level (in-process engine or gRPC serving).
// Arms run in paired, interleaved rounds so that machine drift hits all of
// them; every arm's greedy tokens are compared with the baseline's.
package attrib

import (
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/pass"
)

// ModelRef names the checkpoint: a directory or a random preset.
type ModelRef struct {
	Dir    string `koanf:"dir" path:""`
	Preset string `koanf:"preset"`
	Seed   int64  `koanf:"seed"`
	// FP8 writes the preset in the FP8 layout (as the released checkpoint
	// is stored); Set scales it (text_config fields set to other values).
	FP8 bool           `koanf:"fp8"`
	Set map[string]any `koanf:"set"`
}

// Workload is a fixed set of random-token requests.
type Workload struct {
	Name        string `koanf:"name"`
	InputLen    int    `koanf:"input_len"`
	OutputLen   int    `koanf:"output_len"`
	Requests    int    `koanf:"requests"`
	Concurrency []int  `koanf:"concurrency"`
	// RequestsPerLevel, when given, is how many of the workload's requests
	// (the first ones) each concurrency level runs, in the order of
	// Concurrency: a scaled campaign keeps its sequential C1 cells short.
	RequestsPerLevel []int  `koanf:"requests_per_level"`
	Seed             uint64 `koanf:"seed"`
}

// ArmSpec is an explicitly listed arm.
type ArmSpec struct {
	Name   string              `koanf:"name"`
	Passes []config.PassConfig `koanf:"passes"`
}

// Arms chooses which arms a study runs.
type Arms struct {
	Baseline    bool      `koanf:"baseline"`
	All         bool      `koanf:"all"`
	LeaveOneOut bool      `koanf:"leave_one_out"`
	AddOneIn    bool      `koanf:"add_one_in"`
	Explicit    []ArmSpec `koanf:"explicit"`
}

// RuntimeLimits are passed to the scheduler (zero: its defaults).
type RuntimeLimits struct {
	MaxBatchTokens int `koanf:"max_batch_tokens"`
	PrefillChunk   int `koanf:"prefill_chunk"`
}

// Serving configures the serving level.
type Serving struct {
	// Binary is the glmflash executable started once per arm
	// (default: this process's own executable). An executable a study
	// names runs only with its checksum: BinarySHA256 is required with it,
	// and what runs is the copy that was hashed (as for plugins).
	Binary       string `koanf:"binary" path:""`
	BinarySHA256 string `koanf:"binary_sha256"`
	// StartTimeoutS bounds a server's start (default 300).
	StartTimeoutS int `koanf:"start_timeout_s"`
	// Env sets environment variables of every arm's server, beyond the
	// system ones it inherits (ArmEnv): the arms get no GLMFLASH_ variable
	// of the study's process, so a developer switch (GLMFLASH_GEMM) must be
	// given here; a configuration variable (GLMFLASH_RUNTIME__SLOTS) is
	// refused, the study decides the arms' configuration.
	Env map[string]string `koanf:"env"`
}

// InheritedEnv are the variables an arm's server inherits from the study's
// process, by name or by prefix (a trailing "_"): what a process needs to
// run (PATH, HOME, temporary files, locale), the GPU's libraries and
// devices, and the Go runtime's settings (the same for every arm).
var InheritedEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "TZ", "LANG", "LC_", "LD_LIBRARY_PATH",
	"CUDA_", "NVIDIA_", "GOMAXPROCS", "GOMEMLIMIT", "GOGC", "GODEBUG", "GOCOVERDIR"}

// ArmEnv is the environment of an arm's server: the InheritedEnv variables
// of environ (os.Environ's format), then the study's serving.env, sorted by
// name. Nothing else of the study's process leaks in: its GLMFLASH_
// variables overrode the arms' configuration files (issue 37).
func (s *Study) ArmEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, ok := strings.Cut(kv, "=")
		if _, set := s.Serving.Env[name]; !ok || set {
			continue
		}
		for _, in := range InheritedEnv {
			if name == in || strings.HasSuffix(in, "_") && strings.HasPrefix(name, in) {
				out = append(out, kv)
				break
			}
		}
	}
	for name, v := range s.Serving.Env {
		out = append(out, name+"="+v)
	}
	sort.Strings(out)
	return out
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkEnv validates serving.env: variable names, and no configuration
// variable (config.EnvPrefix and a key path, or a top-level key).
func checkEnv(env map[string]string) error {
	names := make([]string, 0, len(env))
	for n := range env {
		names = append(names, n)
	}
	sort.Strings(names)
	top := map[string]bool{}
	t := reflect.TypeFor[config.Config]()
	for i := 0; i < t.NumField(); i++ {
		if tag := t.Field(i).Tag.Get("koanf"); tag != "" && tag != "-" {
			top[tag] = true
		}
	}
	for _, n := range names {
		f := "serving.env." + n
		if !envNameRE.MatchString(n) {
			return fmt.Errorf("%s: %q is not a variable name (letters, digits and _, not starting with a digit)", f, n)
		}
		if rest, ok := strings.CutPrefix(n, config.EnvPrefix); ok {
			if key := strings.ToLower(strings.ReplaceAll(rest, "__", ".")); strings.Contains(rest, "__") || top[key] {
				return fmt.Errorf("%s: sets the configuration key %s, which the study decides for its arms (its passes, runtime, device, precision, cuda keys)", f, key)
			}
		}
		if len(env[n]) > 4096 {
			return fmt.Errorf("%s: the value is longer than 4096 bytes", f)
		}
	}
	return nil
}

// Adaptive makes a study add paired rounds until every interval is narrow
// enough.
type Adaptive struct {
	// TargetHalfWidth is the widest acceptable half-width of a ratio's 95%
	// interval (0.01 = ±1%).
	TargetHalfWidth float64 `koanf:"target_half_width"`
	// MinRounds are always run (at least 2: an interval needs two rounds);
	// MaxRounds bound the measured rounds.
	MinRounds int `koanf:"min_rounds"`
	MaxRounds int `koanf:"max_rounds"`
	// MaxSeconds, when set, stops adding rounds once the next one would
	// end past this many seconds of measurement (warm-up included).
	MaxSeconds float64 `koanf:"max_seconds"`
}

// Study is a parsed study file.
type Study struct {
	Name        string   `koanf:"name"`
	Description string   `koanf:"description"`
	Model       ModelRef `koanf:"model"`
	// Device, Precision and CUDA override the base configuration's engine
	// settings when set (a study records what it ran on).
	Device      string              `koanf:"device"`
	Precision   backend.Precision   `koanf:"precision"`
	CUDA        *config.CUDA        `koanf:"cuda"`
	Level       string              `koanf:"level"`
	Passes      []config.PassConfig `koanf:"passes"`
	Plugins     config.Plugins      `koanf:"plugins"`
	Arms        Arms                `koanf:"arms"`
	Workloads   []Workload          `koanf:"workloads"`
	Repetitions int                 `koanf:"repetitions"`
	Adaptive    *Adaptive           `koanf:"adaptive"`
	Warmup      int                 `koanf:"warmup"`
	Runtime     RuntimeLimits       `koanf:"runtime"`
	Serving     Serving             `koanf:"serving"`
	OutputDir   string              `koanf:"output_dir" path:""`
	// Parity is how greedy tokens that differ from the baseline's count:
	// "exact" (the default: any difference fails the study; the fp32
	// parity mode promises identical tokens whatever the passes and the
	// batch) or "report" (differences are counted and reported beside the
	// A/A arm's, which has the same configuration: in precision bf16 the
	// library GEMMs' sums depend on the batch's rows and the passes' GEMM
	// shapes, so greedy tokens of random weights are not reproducible
	// under continuous batching).
	Parity string `koanf:"parity"`

	Source string `koanf:"-"`
}

// Bounds of a study: far above any useful study on one machine, far below
// what would exhaust its memory before the first measurement.
const (
	MaxRequests     = 100_000 // per workload
	MaxTokens       = 1 << 20 // input_len and output_len
	MaxPromptTokens = 1 << 26 // requests × input_len, held in memory
	MaxConcurrency  = 1024    // per level (cache slots of an arm's engine)
	MaxRounds       = 1000    // repetitions + warmup
	// MaxStartTimeoutS bounds serving.start_timeout_s (a day).
	MaxStartTimeoutS = 86400
)

// Parity modes.
const (
	ParityExact  = "exact"
	ParityReport = "report"
)

// Levels.
const (
	LevelEngine  = "engine"
	LevelServing = "serving"
)

// Load reads and validates a study file with the configuration loader
// (core/config: strict, every error naming the key and the file; relative
// paths relative to the file). A study has no environment layer: it is a
// recorded experiment. known reports whether a pass name exists (built-in
// or plugin); nil means the built-in registry.
func Load(path string, known func(name string) bool) (*Study, error) {
	l, err := config.FileLayer(path)
	if err != nil {
		return nil, fmt.Errorf("study: %w", err)
	}
	return parse(l, known)
}

// Parse decodes a study from YAML bytes; source names them in errors, and
// relative paths in them stay as they are.
func Parse(b []byte, source string, known func(string) bool) (*Study, error) {
	l, err := config.BytesLayer(source, "", b)
	if err != nil {
		return nil, err
	}
	return parse(l, known)
}

func parse(l config.Layer, known func(string) bool) (*Study, error) {
	var s Study
	src, err := config.Decode(&s, []config.Layer{l})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	s.Source = l.Name
	for i := range s.Passes {
		s.Passes[i].Dir = src.Dir("passes")
	}
	for i := range s.Arms.Explicit {
		for j := range s.Arms.Explicit[i].Passes {
			s.Arms.Explicit[i].Passes[j].Dir = src.Dir("arms")
		}
	}
	if known == nil {
		known = func(n string) bool { _, ok := pass.Lookup(n); return ok }
	}
	if err := s.validate(known); err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	return &s, nil
}

// MaxNameLength bounds the name of a study, a workload or an arm.
const MaxNameLength = 64

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)

// checkName checks the name of a study, a workload or an explicit arm:
// ASCII letters, digits and . _ + -, starting with a letter or a digit, at
// most MaxNameLength bytes. A name becomes part of a file name (the default
// output directory out/studies/NAME-TIME, an arm server's configuration)
// and of Markdown tables in report.md, so a "/" (a study named "../x"
// wrote outside out/studies), a "|" or a backquote is refused rather than
// escaped in each place.
func checkName(field, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s: required", field)
	case len(name) > MaxNameLength:
		return fmt.Errorf("%s: %d bytes, more than %d", field, len(name), MaxNameLength)
	case !nameRE.MatchString(name):
		return fmt.Errorf("%s: %q must be ASCII letters, digits and . _ + - starting with a letter or a digit (it names files and rows of report.md)", field, name)
	}
	return nil
}

func (s *Study) validate(known func(string) bool) error {
	if err := checkName("name", s.Name); err != nil {
		return err
	}
	if (s.Model.Dir == "") == (s.Model.Preset == "") {
		return fmt.Errorf("model: give exactly one of dir or preset")
	}
	if s.Model.Dir != "" && (s.Model.FP8 || len(s.Model.Set) > 0) {
		return fmt.Errorf("model: fp8 and set apply to a preset, not to model.dir")
	}
	if s.Level == "" {
		s.Level = LevelEngine
	}
	switch s.Parity {
	case "":
		s.Parity = ParityExact
	case ParityExact, ParityReport:
	default:
		return fmt.Errorf("parity: must be %s or %s, got %q", ParityExact, ParityReport, s.Parity)
	}
	if s.Device != "" && !slices.Contains(backend.Names(), s.Device) {
		return fmt.Errorf("device: %q is not a backend (%s)", s.Device, strings.Join(backend.Names(), ", "))
	}
	if _, err := backend.ParsePrecision(string(s.Precision)); err != nil { // bf16 runs on the cpu and cuda backends
		return fmt.Errorf("precision: %w", err)
	}
	if s.CUDA != nil && s.CUDA.GraphMaxTokens < -1 {
		return fmt.Errorf("cuda.graph_max_tokens: must be ≥ -1 (-1: no graphs), got %d", s.CUDA.GraphMaxTokens)
	}
	if s.CUDA != nil {
		if err := config.CheckGraphBuckets(s.CUDA.GraphTokenBuckets); err != nil {
			return fmt.Errorf("cuda.graph_token_buckets: %w", err)
		}
		if g := s.CUDA.MaxGraphs; g < 0 || g > 1<<16 {
			return fmt.Errorf("cuda.max_graphs: must be 0 (the default, 256) or in [1, 65536], got %d", g)
		}
	}
	if s.Level != LevelEngine && s.Level != LevelServing {
		return fmt.Errorf("level: must be engine or serving, got %q", s.Level)
	}
	if len(s.Passes) == 0 {
		s.Passes = append(s.Passes, config.Default().Enabled()...) // the built-in configuration's passes that are on
	}
	seen := map[string]bool{}
	for i, p := range s.Passes {
		switch {
		case p.Name == "":
			return fmt.Errorf("passes[%d].name: required", i)
		case !known(p.Name):
			return fmt.Errorf("passes[%d].name: unknown pass %q", i, p.Name)
		case seen[p.Name]:
			return fmt.Errorf("passes[%d].name: %q listed twice", i, p.Name)
		}
		seen[p.Name] = true
		if _, err := s.requests([]config.PassConfig{p}); err != nil {
			return fmt.Errorf("passes[%d]: %w", i, err)
		}
	}
	for i, a := range s.Arms.Explicit {
		if err := checkName(fmt.Sprintf("arms.explicit[%d].name", i), a.Name); err != nil {
			return err
		}
		inArm := map[string]int{}
		for j, p := range a.Passes {
			if p.Name == "" {
				return fmt.Errorf("arms.explicit[%d].passes[%d].name: required", i, j)
			}
			if !known(p.Name) {
				return fmt.Errorf("arms.explicit[%d].passes[%d].name: unknown pass %q", i, j, p.Name)
			}
			if k, dup := inArm[p.Name]; dup {
				return fmt.Errorf("arms.explicit[%d].passes[%d].name: %q is listed twice in arm %q (also passes[%d])", i, j, p.Name, a.Name, k)
			}
			inArm[p.Name] = j
		}
	}
	if len(s.Workloads) == 0 {
		return fmt.Errorf("workloads: at least one workload is required")
	}
	names := map[string]bool{}
	for i, w := range s.Workloads {
		f := fmt.Sprintf("workloads[%d]", i)
		if err := checkName(f+".name", w.Name); err != nil {
			return err
		}
		switch {
		case names[w.Name]:
			return fmt.Errorf("%s.name: %q used twice", f, w.Name)
		case w.InputLen < 1:
			return fmt.Errorf("%s.input_len: must be ≥ 1", f)
		case w.OutputLen < 1:
			return fmt.Errorf("%s.output_len: must be ≥ 1", f)
		case w.Requests < 1:
			return fmt.Errorf("%s.requests: must be ≥ 1", f)
		case len(w.Concurrency) == 0:
			return fmt.Errorf("%s.concurrency: at least one level is required", f)
		}
		switch {
		case w.InputLen > MaxTokens:
			return fmt.Errorf("%s.input_len: %d is more than %d", f, w.InputLen, MaxTokens)
		case w.OutputLen > MaxTokens:
			return fmt.Errorf("%s.output_len: %d is more than %d", f, w.OutputLen, MaxTokens)
		case w.Requests > MaxRequests:
			return fmt.Errorf("%s.requests: %d is more than %d", f, w.Requests, MaxRequests)
		case int64(w.Requests)*int64(w.InputLen) > MaxPromptTokens:
			return fmt.Errorf("%s: requests × input_len = %d prompt tokens, more than %d", f, int64(w.Requests)*int64(w.InputLen), MaxPromptTokens)
		}
		seenC := map[int]bool{}
		for j, c := range w.Concurrency {
			if c < 1 || c > MaxConcurrency {
				return fmt.Errorf("%s.concurrency[%d]: must be in [1, %d], got %d", f, j, MaxConcurrency, c)
			}
			if seenC[c] {
				return fmt.Errorf("%s.concurrency[%d]: level %d listed twice", f, j, c)
			}
			seenC[c] = true
		}
		if w.RequestsPerLevel != nil {
			if len(w.RequestsPerLevel) != len(w.Concurrency) {
				return fmt.Errorf("%s.requests_per_level: %d entries for %d concurrency levels (one per level, in the same order)", f, len(w.RequestsPerLevel), len(w.Concurrency))
			}
			for j, n := range w.RequestsPerLevel {
				if n < 1 || n > w.Requests {
					return fmt.Errorf("%s.requests_per_level[%d]: must be in [1, requests = %d], got %d", f, j, w.Requests, n)
				}
			}
		}
		names[w.Name] = true
	}
	if a := s.Adaptive; a != nil {
		if s.Repetitions != 0 {
			return fmt.Errorf("repetitions: not with adaptive (adaptive.min_rounds and adaptive.max_rounds bound the rounds)")
		}
		if a.MinRounds == 0 {
			a.MinRounds = 3
		}
		switch {
		case !(a.TargetHalfWidth > 0 && a.TargetHalfWidth <= 1):
			return fmt.Errorf("adaptive.target_half_width: must be in (0, 1] (0.01 = ±1%%), got %g", a.TargetHalfWidth)
		case a.MinRounds < 2:
			return fmt.Errorf("adaptive.min_rounds: must be ≥ 2 (an interval needs two paired rounds), got %d", a.MinRounds)
		case a.MaxRounds < a.MinRounds:
			return fmt.Errorf("adaptive.max_rounds: must be ≥ min_rounds (%d), got %d", a.MinRounds, a.MaxRounds)
		case a.MaxRounds > MaxRounds || s.Warmup > MaxRounds || a.MaxRounds+s.Warmup > MaxRounds: // each bounded first: the sum must not wrap
			return fmt.Errorf("adaptive.max_rounds: %d + warmup %d is more than %d rounds", a.MaxRounds, s.Warmup, MaxRounds)
		case a.MaxSeconds < 0 || math.IsNaN(a.MaxSeconds) || math.IsInf(a.MaxSeconds, 0):
			return fmt.Errorf("adaptive.max_seconds: must be ≥ 0 (0: no time limit), got %g", a.MaxSeconds)
		}
		s.Repetitions = a.MaxRounds
	}
	if s.Repetitions == 0 {
		s.Repetitions = 3
	}
	if s.Repetitions < 1 || s.Warmup < 0 || s.Repetitions > MaxRounds || s.Warmup > MaxRounds || s.Repetitions+s.Warmup > MaxRounds {
		return fmt.Errorf("repetitions must be ≥ 1 and warmup ≥ 0, %d rounds in all at most (got %d and %d)", MaxRounds, s.Repetitions, s.Warmup)
	}
	if s.Runtime.MaxBatchTokens < 0 || s.Runtime.PrefillChunk < 0 || s.Runtime.MaxBatchTokens > MaxTokens || s.Runtime.PrefillChunk > MaxTokens {
		return fmt.Errorf("runtime: max_batch_tokens and prefill_chunk must be in [0, %d]", MaxTokens)
	}
	if s.Serving.StartTimeoutS < 0 || s.Serving.StartTimeoutS > MaxStartTimeoutS {
		return fmt.Errorf("serving.start_timeout_s: must be in [0, %d] (0: the default), got %d", MaxStartTimeoutS, s.Serving.StartTimeoutS)
	}
	switch sv := s.Serving; {
	case sv.Binary != "" && sv.BinarySHA256 == "":
		return fmt.Errorf("serving.binary_sha256 is required with serving.binary (%s): an executable a study names runs only with its SHA-256 (sha256sum %s)", sv.Binary, sv.Binary)
	case sv.Binary == "" && sv.BinarySHA256 != "":
		return fmt.Errorf("serving.binary_sha256 is set without serving.binary (the default, this executable, needs none)")
	case sv.BinarySHA256 != "" && !isHexSHA256(sv.BinarySHA256):
		return fmt.Errorf("serving.binary_sha256: %q is not a hex SHA-256 (64 hex digits)", sv.BinarySHA256)
	}
	if err := checkEnv(s.Serving.Env); err != nil {
		return err
	}
	if len(s.Serving.Env) > 0 && s.Level != LevelServing {
		return fmt.Errorf("serving.env: only for level: serving (an engine-level study starts no server)")
	}
	arms, err := s.Expand()
	if err != nil {
		return err
	}
	if len(arms) == 0 {
		return fmt.Errorf("arms: the arm list is empty (enable baseline, all, leave_one_out, add_one_in or list explicit arms)")
	}
	if !s.Arms.Baseline {
		return fmt.Errorf("arms.baseline: must be true (gaps and parity are measured against it)")
	}
	return nil
}

// CheckModel checks the study against the model it runs on, before
// anything is measured: every request must fit the context (input_len +
// output_len ≤ contextLimit) and the vocabulary must have room for the
// random prompts. Errors name the source and the field.
func (s *Study) CheckModel(vocab, contextLimit int) error {
	if vocab < 2 {
		return fmt.Errorf("%s: model: vocab_size %d leaves no tokens to draw prompts from", s.Source, vocab)
	}
	for i, w := range s.Workloads {
		if w.InputLen+w.OutputLen > contextLimit {
			return fmt.Errorf("%s: workloads[%d] (%s): input_len %d + output_len %d exceed the model's context limit %d", s.Source, i, w.Name, w.InputLen, w.OutputLen, contextLimit)
		}
	}
	return nil
}

// requests checks pass options by building the pipeline the arm would use.
func (s *Study) requests(ps []config.PassConfig) ([]pass.Request, error) {
	var reqs []pass.Request
	for _, p := range ps {
		reqs = append(reqs, pass.Request{Name: p.Name, Options: p.Options, Dir: p.Dir})
	}
	for _, r := range reqs {
		if reg, ok := pass.Lookup(r.Name); ok {
			schema, err := reg.Schema()
			if err != nil {
				return nil, err
			}
			if _, err := pass.Normalize(schema, r.Options, r.Dir); err != nil {
				return nil, fmt.Errorf("pass %s: %w", r.Name, err)
			}
		}
	}
	return reqs, nil
}

// Arm kinds.
const (
	KindBaseline    = "baseline"
	KindAA          = "aa"
	KindAll         = "all"
	KindLeaveOneOut = "leave-one-out"
	KindAddOneIn    = "add-one-in"
	KindExplicit    = "explicit"
)

// AAName is the A/A arm's name: the baseline measured as a second arm.
const AAName = "baseline-aa"

// Arm is one configuration measured by a study.
type Arm struct {
	Name    string              // "baseline", "all", "-mhc-post-pre-fusion", "+dsa-pooled-metadata", explicit names
	Kind    string              // baseline, all, leave-one-out, add-one-in, explicit
	Subject string              // the pass left out or added in
	Passes  []config.PassConfig // in order
}

// Expand lists the study's arms in a stable order.
func (s *Study) Expand() ([]Arm, error) {
	var arms []Arm
	if s.Arms.Baseline {
		// the A/A arm: the baseline again, a separate engine (or server)
		// measured in the same interleaved rounds; its interval is the
		// study's noise floor and must contain a ratio of 1
		arms = append(arms, Arm{Name: "baseline", Kind: KindBaseline}, Arm{Name: AAName, Kind: KindAA})
	}
	if s.Arms.All {
		arms = append(arms, Arm{Name: "all", Kind: KindAll, Passes: s.Passes})
	}
	if s.Arms.LeaveOneOut {
		for _, p := range s.Passes {
			var ps []config.PassConfig
			for _, q := range s.Passes {
				if q.Name != p.Name {
					ps = append(ps, q)
				}
			}
			arms = append(arms, Arm{Name: "-" + p.Name, Kind: KindLeaveOneOut, Subject: p.Name, Passes: ps})
		}
	}
	if s.Arms.AddOneIn {
		for _, p := range s.Passes {
			arms = append(arms, Arm{Name: "+" + p.Name, Kind: KindAddOneIn, Subject: p.Name, Passes: []config.PassConfig{p}})
		}
	}
	names := map[string]bool{}
	for _, a := range arms {
		names[a.Name] = true
	}
	for i, e := range s.Arms.Explicit {
		if names[e.Name] {
			return nil, fmt.Errorf("arms.explicit[%d].name: %q collides with a generated arm", i, e.Name)
		}
		names[e.Name] = true
		arms = append(arms, Arm{Name: e.Name, Kind: KindExplicit, Passes: e.Passes})
	}
	return arms, nil
}

// Cell is one (workload, concurrency) combination.
type Cell struct {
	Workload    Workload
	Concurrency int
	// Requests is how many of the workload's requests the cell runs.
	Requests int
}

// Name is "chat C16".
func (c Cell) Name() string { return fmt.Sprintf("%s C%d", c.Workload.Name, c.Concurrency) }

// Cells lists the study's cells in order.
func (s *Study) Cells() []Cell {
	var out []Cell
	for _, w := range s.Workloads {
		var cs []Cell
		for i, c := range w.Concurrency {
			n := w.Requests
			if i < len(w.RequestsPerLevel) {
				n = w.RequestsPerLevel[i]
			}
			cs = append(cs, Cell{Workload: w, Concurrency: c, Requests: n})
		}
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].Concurrency < cs[j].Concurrency })
		out = append(out, cs...)
	}
	return out
}

// EngineConfig is the configuration of an arm: base (the built-in one when
// nil) with the arm's passes, and the study's plugins section when it has
// one.
func (s *Study) EngineConfig(base *config.Config, a Arm) *config.Config {
	if base == nil {
		base = config.Default()
	}
	e := *s.ApplyEngine(base)
	e.Passes = append([]config.PassConfig(nil), a.Passes...)
	if s.Plugins.Dir != "" {
		e.Plugins = s.Plugins
	}
	e.Source = s.Source + "#" + a.Name
	return &e
}

// ApplyEngine returns base (the built-in configuration when nil) with the
// study's device, precision and cuda settings where it sets them.
func (s *Study) ApplyEngine(base *config.Config) *config.Config {
	if base == nil {
		base = config.Default()
	}
	e := *base
	if s.Device != "" {
		e.Device = s.Device
	}
	if s.Precision != "" {
		e.Precision = s.Precision
	}
	if s.CUDA != nil {
		e.CUDA = *s.CUDA
	}
	return &e
}

// MaxPositions is the longest sequence the study's requests make (input
// plus output), at most limit: what an arm's cache needs to hold.
func (s *Study) MaxPositions(limit int) int {
	n := 1
	for _, w := range s.Workloads {
		n = max(n, w.InputLen+w.OutputLen)
	}
	return min(n, limit)
}

// isHexSHA256 reports whether s is 64 hex digits.
func isHexSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}
