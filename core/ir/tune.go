package ir

// GEMMTuner is a backend that chooses its GEMM kernels by measurement on
// its device (prefill-autotune there; the engine hands it to the passes,
// which know no backend): per weight shape and row count it
// times the candidates (its own kernels' variants, the vendor library's
// algorithms), rejects those whose outputs differ beyond a tolerance from
// the default's, and names the fastest.
type GEMMTuner interface {
	// TunerInfo names the device and library the choices belong to.
	TunerInfo() TunerInfo
	// GEMMKind names the GEMM flavour a weight stored in the checkpoint as
	// weightDType ("BF16", "F32", "F8_E4M3", …) gets on this backend
	// (activations and weights as the kernels see them).
	GEMMKind(weightDType string) string
	// GEMMCandidates lists the choices for kind at rows (without
	// measuring: "lt" stands for the library's algorithms, listed by its
	// heuristic when tuning).
	GEMMCandidates(kind string, rows int) []string
	// TuneGEMM measures the candidates for one shape.
	TuneGEMM(t GEMMTune) (GEMMChoice, error)
}

// TunerInfo names what a tuning table is valid for.
type TunerInfo struct {
	Device  string // backend name: "cuda"
	Model   string // the device's name: "NVIDIA H200"
	Library string // the vendor library and version choices depend on: "cuBLASLt 130000"
}

// GEMMTune asks for one measurement: y[Rows][N] = x[Rows][K]·W[N][K]ᵀ of
// the given kind, reps timed runs per candidate (median), candidates
// whose outputs differ from the default's by more than Tolerance
// (relative) rejected.
type GEMMTune struct {
	Kind        string
	N, K, Rows  int
	Reps        int
	Tolerance   float64
	MaxLibAlgos int // vendor-library algorithms to try (0: 8)
}

// GEMMChoice is the outcome: the chosen kernel (a string the backend's
// binding reads back), its description, the default's and the choice's
// median times, how many candidates were measured and rejected.
type GEMMChoice struct {
	Kernel    string
	Name      string
	DefaultNs int64
	TunedNs   int64
	Measured  int
	Rejected  int
}
