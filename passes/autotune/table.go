package autotune

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/glmflash/glmflash/internal/regular"
)

// Entry is one tuned kernel choice. A CPU table's entries hold the Go
// kernels' parameters (ColGrain, RowBlock); a device table's the backend's
// kernel choice (Kernel: "col:128", "tiled", "lt:…"), with DType the
// GEMM kind it was measured for ("f32a-bf16w", …).
type Entry struct {
	Op       string `json:"op"`
	DType    string `json:"dtype"`
	N        int    `json:"n"`
	K        int    `json:"k"`
	Bucket   int    `json:"bucket"`
	ColGrain int    `json:"col_grain,omitempty"`
	RowBlock int    `json:"row_block,omitempty"`
	Kernel   string `json:"kernel,omitempty"`
	// KernelName describes Kernel ("cuBLASLt algo 21 tile 18 split-k 1").
	KernelName string `json:"kernel_name,omitempty"`
	// measured medians, for the record, and how many candidates were
	// measured and rejected (outputs beyond the tolerance)
	DefaultNS int64 `json:"default_ns"`
	TunedNS   int64 `json:"tuned_ns"`
	Measured  int   `json:"measured,omitempty"`
	Rejected  int   `json:"rejected,omitempty"`
}

// Key identifies an entry within one CPU's table.
func (e Entry) Key() string { return key(e.Op, e.DType, e.N, e.K, e.Bucket) }

func key(op, dt string, n, k, bucket int) string {
	return fmt.Sprintf("%s|%s|%dx%d|%d", op, dt, n, k, bucket)
}

// Table is the persisted tuning table of one CPU model and GEMM
// implementation (ISA: "avx512", "avx2", "go": the kernels whose
// parameters were measured; one CPU model name can come with or without
// AVX-512, and parameters tuned for one set of kernels say nothing of
// another), or of one device model (Device set: "cuda"; GPU names it,
// Library is the vendor library its library choices belong to).
type Table struct {
	CPU     string  `json:"cpu,omitempty"`
	ISA     string  `json:"isa,omitempty"`
	GOARCH  string  `json:"goarch,omitempty"`
	Device  string  `json:"device,omitempty"`
	GPU     string  `json:"gpu,omitempty"`
	Library string  `json:"library,omitempty"`
	Entries []Entry `json:"entries"`
	index   map[string]Entry
}

func (t *Table) reindex() {
	t.index = map[string]Entry{}
	for _, e := range t.Entries {
		t.index[e.Key()] = e
	}
}

// Get finds an entry.
func (t *Table) Get(op, dt string, n, k, bucket int) (Entry, bool) {
	e, ok := t.index[key(op, dt, n, k, bucket)]
	return e, ok
}

// Put adds or replaces an entry.
func (t *Table) Put(e Entry) {
	if t.index == nil {
		t.reindex()
	}
	if _, ok := t.index[e.Key()]; ok {
		for i := range t.Entries {
			if t.Entries[i].Key() == e.Key() {
				t.Entries[i] = e
			}
		}
	} else {
		t.Entries = append(t.Entries, e)
	}
	t.index[e.Key()] = e
}

// CPUModel names this machine's processor (from /proc/cpuinfo on Linux).
func CPUModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "model name") {
				if i := strings.Index(line, ":"); i >= 0 {
					return strings.TrimSpace(line[i+1:])
				}
			}
		}
	}
	return runtime.GOARCH
}

// slug makes a file-name-safe version of a CPU name.
func slug(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			if b.Len() > 0 && !strings.HasSuffix(b.String(), "-") {
				b.WriteByte('-')
			}
		}
	}
	return strings.Trim(b.String(), "-")
}

// TablePath is where the table of cpu and GEMM implementation isa lives
// under dir ("amd-epyc-avx512-amd64.json").
func TablePath(dir, cpu, isa string) string {
	return filepath.Join(dir, slug(cpu)+"-"+slug(isa)+"-"+runtime.GOARCH+".json")
}

// OtherTables lists the tables under dir of cpu that are not isa's: those
// of other GEMM implementations, and one from before tables were keyed by
// implementation (named without it, holding no isa). A file is counted by
// what it holds (its cpu), not only by its name.
func OtherTables(dir, cpu, isa string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, slug(cpu)+"-*"+runtime.GOARCH+".json"))
	var out []string
	for _, f := range m {
		b, err := regular.ReadFile(f, regular.ConfigLimit)
		if err != nil {
			continue
		}
		var t Table
		if json.Unmarshal(b, &t) == nil && t.Device == "" && t.CPU == cpu && t.ISA != isa {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

// DeviceTablePath is where the table of a device model lives under dir
// ("cuda-nvidia-h200.json").
func DeviceTablePath(dir, device, model string) string {
	return filepath.Join(dir, slug(device)+"-"+slug(model)+".json")
}

// path is where the table is saved.
func (t *Table) path(dir string) string {
	if t.Device != "" {
		return DeviceTablePath(dir, t.Device, t.GPU)
	}
	return TablePath(dir, t.CPU, t.ISA)
}

// LoadTable reads the table for cpu and GEMM implementation isa from dir;
// a missing file is an empty table, a malformed one (or one whose isa is
// another's) an error naming the file.
func LoadTable(dir, cpu, isa string) (*Table, error) {
	p := TablePath(dir, cpu, isa)
	t, err := load(p, &Table{CPU: cpu, ISA: isa, GOARCH: runtime.GOARCH})
	if err == nil && t.ISA != isa {
		return nil, fmt.Errorf("tuning table %s is for the %q GEMM kernels, not %q", p, t.ISA, isa)
	}
	return t, err
}

// LoadDeviceTable reads the table of a device model (a missing file is an
// empty table).
func LoadDeviceTable(dir, device, model string) (*Table, error) {
	return load(DeviceTablePath(dir, device, model), &Table{Device: device, GPU: model})
}

func load(p string, t *Table) (*Table, error) {
	dev, gpu := t.Device, t.GPU
	b, err := regular.ReadFile(p, regular.ConfigLimit)
	if os.IsNotExist(err) {
		t.reindex()
		return t, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("tuning table %s: %w", p, err)
	}
	if t.Device != dev || t.GPU != gpu {
		return nil, fmt.Errorf("tuning table %s is for device %q (%q), not %q (%q)", p, t.Device, t.GPU, dev, gpu)
	}
	for i, e := range t.Entries {
		switch {
		case e.Bucket < 1 || e.N < 1 || e.K < 1:
			return nil, fmt.Errorf("tuning table %s: entry %d (%s) has non-positive fields", p, i, e.Key())
		case dev == "" && (e.ColGrain < 1 || e.RowBlock < 1):
			return nil, fmt.Errorf("tuning table %s: entry %d (%s) has non-positive fields", p, i, e.Key())
		case dev != "" && e.Kernel == "":
			return nil, fmt.Errorf("tuning table %s: entry %d (%s) names no kernel", p, i, e.Key())
		}
	}
	t.reindex()
	return t, nil
}

// Save writes the table (sorted, atomically).
func (t *Table) Save(dir string) error {
	sort.Slice(t.Entries, func(i, j int) bool { return t.Entries[i].Key() < t.Entries[j].Key() })
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(t, "", "  ")
	p := t.path(dir)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
