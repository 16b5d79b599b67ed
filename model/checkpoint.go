package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/glmflash/glmflash/internal/regular"
	"github.com/glmflash/glmflash/model/safetensors"
)

// File names inside a checkpoint directory.
const (
	ConfigFile       = "config.json"
	SingleFile       = "model.safetensors"
	IndexFile        = "model.safetensors.index.json"
	safetensorsGlob  = "*.safetensors"
	maxReportedError = 20
)

type tensorLoc struct {
	file *safetensors.File
	info safetensors.TensorInfo
}

// Checkpoint is an open Hugging Face checkpoint directory: config.json plus
// one safetensors file, a sharded set described by model.safetensors.index.json,
// or every *.safetensors file in the directory. Reads are safe for concurrent use.
type Checkpoint struct {
	dir string
	// source describes generated weights (NewGenerated) in messages and
	// reports; "" for a checkpoint read from dir.
	source  string
	cfg     *Config
	mode    safetensors.Mode
	files   []*safetensors.File
	tensors map[string]tensorLoc
}

// OpenOptions configure OpenWith.
type OpenOptions struct {
	// Weights is how the safetensors files are held (model.weights):
	// safetensors.Copy (the default) reads them into memory at open, so
	// that a file truncated or overwritten while serving changes nothing;
	// safetensors.Guarded maps them (no memory of their own, but the files
	// are the served weights: CheckWeights refuses them once one changed on
	// disk, and a reader's fault on a truncated one becomes an error).
	Weights safetensors.Mode
}

// Open opens the checkpoint in dir: it parses config.json (with the
// end-of-sequence ids of generation_config.json, when present, added to
// its own) and validates it, then
// opens the safetensors files (model.safetensors.index.json if present, else
// model.safetensors, else every *.safetensors file). A sharded index must
// reference existing shards that hold the tensors it maps to them.
func Open(dir string) (*Checkpoint, error) { return OpenWith(dir, OpenOptions{}) }

// OpenWith is Open with options.
func OpenWith(dir string, o OpenOptions) (*Checkpoint, error) {
	cfg, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	ck := &Checkpoint{dir: dir, cfg: cfg, mode: o.Weights, tensors: make(map[string]tensorLoc)}
	if err := ck.openTensors(); err != nil {
		ck.Close()
		return nil, err
	}
	return ck, nil
}

// ReadConfig reads a checkpoint directory's configuration as Open does:
// config.json parsed and validated, with the end-of-sequence ids of
// generation_config.json, when present, added to its own. It reads no
// weights.
func ReadConfig(dir string) (*Config, error) {
	cfgPath := filepath.Join(dir, ConfigFile)
	data, err := regular.ReadFile(cfgPath, regular.ConfigLimit)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	cfg, err := ParseConfig(data, cfgPath)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// after config.json is valid (vocab_size): an error of
	// generation_config.json names that file, not config.json
	if err := mergeGenerationConfig(dir, cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (ck *Checkpoint) openFile(path string) (*safetensors.File, error) {
	f, err := safetensors.OpenMode(path, ck.mode)
	if err != nil {
		return nil, err
	}
	ck.files = append(ck.files, f)
	return f, nil
}

func (ck *Checkpoint) openTensors() error {
	indexPath := filepath.Join(ck.dir, IndexFile)
	if _, err := os.Stat(indexPath); err == nil {
		return ck.openIndex(indexPath)
	}
	single := filepath.Join(ck.dir, SingleFile)
	paths := []string{single}
	if _, err := os.Stat(single); err != nil {
		paths, err = filepath.Glob(filepath.Join(ck.dir, safetensorsGlob))
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", ck.dir, err)
		}
		if len(paths) == 0 {
			return fmt.Errorf("checkpoint %s: no %s, %s or *.safetensors files", ck.dir, IndexFile, SingleFile)
		}
		sort.Strings(paths)
	}
	for _, p := range paths {
		f, err := ck.openFile(p)
		if err != nil {
			return err
		}
		for name, info := range f.Tensors() {
			if prev, dup := ck.tensors[name]; dup {
				return fmt.Errorf("checkpoint %s: tensor %s is in both %s and %s", ck.dir, name, filepath.Base(prev.file.Path()), filepath.Base(p))
			}
			ck.tensors[name] = tensorLoc{file: f, info: info}
		}
	}
	return nil
}

func (ck *Checkpoint) openIndex(indexPath string) error {
	data, err := regular.ReadFile(indexPath, regular.ConfigLimit)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", ck.dir, err)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&idx); err != nil {
		return fmt.Errorf("%s: invalid index: %w", indexPath, err)
	}
	if len(idx.WeightMap) == 0 {
		return fmt.Errorf("%s: weight_map is missing or empty", indexPath)
	}
	shards := make(map[string]*safetensors.File)
	names := make([]string, 0, len(idx.WeightMap))
	for n := range idx.WeightMap {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		shard := idx.WeightMap[name]
		if shard == "" || filepath.IsAbs(shard) || slices.Contains(strings.Split(filepath.ToSlash(shard), "/"), "..") {
			return fmt.Errorf("%s: tensor %s maps to invalid shard name %q", indexPath, name, shard)
		}
		f, ok := shards[shard]
		if !ok {
			p := filepath.Join(ck.dir, filepath.FromSlash(shard))
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("%s: tensor %s maps to shard %s, which is missing: %w", indexPath, name, shard, err)
			}
			if f, err = ck.openFile(p); err != nil {
				return err
			}
			shards[shard] = f
		}
		info, ok := f.Info(name)
		if !ok {
			return fmt.Errorf("%s: tensor %s maps to shard %s, which does not hold it", indexPath, name, shard)
		}
		ck.tensors[name] = tensorLoc{file: f, info: info}
	}
	return nil
}

// Dir returns the checkpoint directory.
func (ck *Checkpoint) Dir() string { return ck.dir }

// Config returns the parsed, validated text configuration.
func (ck *Checkpoint) Config() *Config { return ck.cfg }

// Has reports whether the checkpoint holds the named tensor.
func (ck *Checkpoint) Has(name string) bool {
	_, ok := ck.tensors[name]
	return ok
}

// Info returns the named tensor's description.
func (ck *Checkpoint) Info(name string) (safetensors.TensorInfo, bool) {
	loc, ok := ck.tensors[name]
	return loc.info, ok
}

// DType returns the stored element type of the named tensor.
func (ck *Checkpoint) DType(name string) (safetensors.DType, bool) {
	loc, ok := ck.tensors[name]
	return loc.info.DType, ok
}

// Names returns every tensor name, sorted.
func (ck *Checkpoint) Names() []string {
	names := make([]string, 0, len(ck.tensors))
	for n := range ck.tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Raw returns the stored bytes of the named tensor without conversion. The
// slice aliases a read-only mapping and is valid until Close.
func (ck *Checkpoint) Raw(name string) ([]byte, safetensors.TensorInfo, error) {
	loc, err := ck.lookup(name)
	if err != nil {
		return nil, safetensors.TensorInfo{}, err
	}
	b, err := loc.file.Bytes(name)
	return b, loc.info, err
}

func (ck *Checkpoint) lookup(name string) (tensorLoc, error) {
	loc, ok := ck.tensors[name]
	if !ok {
		return tensorLoc{}, fmt.Errorf("tensor %s: not found in checkpoint %s", name, ck.where())
	}
	return loc, nil
}

// Float32 returns the named tensor as a fresh float32 slice (row-major). When
// shape is given the stored shape must equal it. BF16/F16/F32/F64 tensors are
// converted exactly (F64 rounded); F8E4M3 weights are dequantized with their
// "<name>_scale_inv" block scales: W[r][c] = fp8[r][c]·scale[r/bs0][c/bs1].
func (ck *Checkpoint) Float32(name string, shape ...int) ([]float32, error) {
	loc, err := ck.lookup(name)
	if err != nil {
		return nil, err
	}
	info := loc.info
	if len(shape) > 0 && !slices.Equal(shape, info.Shape) {
		return nil, fmt.Errorf("tensor %s: shape %v, want %v", name, info.Shape, shape)
	}
	if !info.DType.IsFloat() {
		return nil, fmt.Errorf("tensor %s: dtype %s is not a float type", name, info.DType)
	}
	raw, err := loc.file.Bytes(name)
	if err != nil {
		return nil, err
	}
	defer loc.file.Release(name) // the float32 copy is the caller's
	out := make([]float32, info.NumElements())
	if info.DType == safetensors.F8E4M3 {
		if err := ck.dequantFP8(name, info, raw, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	if err := parallelConvert(info.DType, raw, out); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", name, err)
	}
	return out, nil
}

// parallelConvert runs ToFloat32 over chunks of a large tensor in parallel.
func parallelConvert(dt safetensors.DType, raw []byte, out []float32) error {
	const chunk = 1 << 20
	if len(out) <= chunk {
		return safetensors.ToFloat32(dt, raw, out)
	}
	size := dt.Size()
	if len(raw) != len(out)*size {
		return fmt.Errorf("%d bytes of %s do not hold %d elements", len(raw), dt, len(out))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for lo := 0; lo < len(out); lo += chunk {
		hi := min(lo+chunk, len(out))
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := faultless(func() error { return safetensors.ToFloat32(dt, raw[lo*size:hi*size], out[lo:hi]) }); err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// ScaleName returns the block-scale companion name of an FP8 weight.
func ScaleName(weight string) string { return weight + ScaleSuffix }

// scaleFor returns the block scales of an FP8 weight [n, k] as float32,
// validating the companion's presence, dtype and shape.
func (ck *Checkpoint) scaleFor(name string, info safetensors.TensorInfo) ([]float32, []int, error) {
	sloc, want, err := ck.scaleLoc(name, info)
	if err != nil {
		return nil, nil, err
	}
	sname := ScaleName(name)
	raw, err := sloc.file.Bytes(sname)
	if err != nil {
		return nil, nil, err
	}
	defer sloc.file.Release(sname)
	s := make([]float32, sloc.info.NumElements())
	if err := safetensors.ToFloat32(sloc.info.DType, raw, s); err != nil {
		return nil, nil, fmt.Errorf("tensor %s: %w", sname, err)
	}
	return s, want, nil
}

// scaleLoc finds the block scale of an FP8 weight [n, k] and checks its
// presence, dtype and shape, without reading it.
func (ck *Checkpoint) scaleLoc(name string, info safetensors.TensorInfo) (tensorLoc, []int, error) {
	if len(info.Shape) != 2 {
		return tensorLoc{}, nil, fmt.Errorf("tensor %s: F8_E4M3 weight has shape %v, want 2 dimensions", name, info.Shape)
	}
	sname := ScaleName(name)
	sloc, ok := ck.tensors[sname]
	if !ok {
		return tensorLoc{}, nil, fmt.Errorf("tensor %s: F8_E4M3 weight has no block scale %s in checkpoint %s", name, sname, ck.where())
	}
	switch sloc.info.DType {
	case safetensors.F32, safetensors.BF16, safetensors.F16:
	default:
		return tensorLoc{}, nil, fmt.Errorf("tensor %s: dtype %s, want F32 or BF16", sname, sloc.info.DType)
	}
	want := ck.cfg.ScaleShape(info.Shape[0], info.Shape[1])
	if !slices.Equal(sloc.info.Shape, want) {
		bs := ck.cfg.BlockSize()
		return tensorLoc{}, nil, fmt.Errorf("tensor %s: shape %v, want %v (%dx%d blocks of %s %v)", sname, sloc.info.Shape, want, bs[0], bs[1], name, info.Shape)
	}
	return sloc, want, nil
}

// FP8Scales returns the block scales of an F8_E4M3 weight as float32,
// [ceil(rows/block[0])][ceil(cols/block[1])], and the block size (the
// config's weight_block_size), validated as Float32 validates them.
func (ck *Checkpoint) FP8Scales(name string) ([]float32, [2]int, error) {
	loc, err := ck.lookup(name)
	if err != nil {
		return nil, [2]int{}, err
	}
	if loc.info.DType != safetensors.F8E4M3 {
		return nil, [2]int{}, fmt.Errorf("tensor %s: dtype %s, not F8_E4M3", name, loc.info.DType)
	}
	s, _, err := ck.scaleFor(name, loc.info)
	return s, ck.cfg.BlockSize(), err
}

func (ck *Checkpoint) dequantFP8(name string, info safetensors.TensorInfo, raw []byte, out []float32) error {
	scale, sshape, err := ck.scaleFor(name, info)
	if err != nil {
		return err
	}
	n, k := info.Shape[0], info.Shape[1]
	bs := ck.cfg.BlockSize()
	sk := sshape[1]
	rows := func(lo, hi int) {
		for r := lo; r < hi; r++ {
			srow := scale[(r/bs[0])*sk : (r/bs[0]+1)*sk]
			src, dst := raw[r*k:(r+1)*k], out[r*k:(r+1)*k]
			for c, b := range src {
				dst[c] = safetensors.F8E4M3ToFloat32(b) * srow[c/bs[1]]
			}
		}
	}
	if n*k < 1<<20 {
		rows(0, n)
		return nil
	}
	workers := runtime.GOMAXPROCS(0)
	step := ceilDiv(n, workers)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for lo := 0; lo < n; lo += step {
		hi := min(lo+step, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := faultless(func() error { rows(lo, hi); return nil }); err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// faultless runs f, a read of tensor bytes on a goroutine of its own, with
// a memory fault in a Guarded file's mapping (SIGBUS: the file truncated
// under it) turned into the file's error (safetensors.FaultOf); any other
// panic is not recovered.
func faultless(f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if err = safetensors.FaultOf(r); err == nil {
				panic(r)
			}
		}
	}()
	return f()
}

var layerIndexRE = regexp.MustCompile(`^model\.language_model\.layers\.(\d+)\.`)

// IsMTPName reports whether name belongs to a layer at or past num_hidden_layers
// (the MTP/NextN draft layer).
func (c *Config) IsMTPName(name string) bool {
	m := layerIndexRE.FindStringSubmatch(name)
	if m == nil {
		return false
	}
	i, err := strconv.Atoi(m[1])
	return err != nil || i >= c.NumHiddenLayers
}

// Validate checks that every tensor of the weight catalog exists with the
// expected shape and a float dtype. A weight may be stored as BF16, F16 or
// F32, or (FP8-eligible or not) as F8E4M3 with a "<name>_scale_inv" block
// scale of the right shape. Extra tensors (model.visual.*, MTP layers,
// anything else) are ignored: a checkpoint without its MTP layer still
// serves plain decoding (ValidateMTP checks that layer). All problems are
// reported, up to 20.
func (ck *Checkpoint) Validate() error {
	return ck.validateSpecs(ck.cfg.WeightCatalog(false))
}

// ValidateMTP checks the MTP layers' tensors (Config.MTPWeightCatalog) as
// Validate checks the trunk's: needed only for speculative decoding with
// the MTP drafter. It fails when the config declares no MTP layer.
func (ck *Checkpoint) ValidateMTP() error {
	if !ck.cfg.HasMTP() {
		return fmt.Errorf("checkpoint %s: the config declares no MTP layer (num_nextn_predict_layers is %d)", ck.where(), ck.cfg.NumNextNPredictLayers)
	}
	if err := ck.validateSpecs(ck.cfg.MTPWeightCatalog(false)); err != nil {
		return fmt.Errorf("MTP layer %d: %w", ck.cfg.MTPLayer(0), err)
	}
	return nil
}

func (ck *Checkpoint) validateSpecs(specs []WeightSpec) error {
	var errs []error
	for _, spec := range specs {
		loc, ok := ck.tensors[spec.Name]
		if !ok {
			errs = append(errs, fmt.Errorf("tensor %s: missing from checkpoint %s", spec.Name, ck.where()))
			continue
		}
		if !slices.Equal(loc.info.Shape, spec.Shape) {
			errs = append(errs, fmt.Errorf("tensor %s: shape %v, want %v", spec.Name, loc.info.Shape, spec.Shape))
			continue
		}
		switch loc.info.DType {
		case safetensors.BF16, safetensors.F16, safetensors.F32:
		case safetensors.F8E4M3:
			check := ck.scaleFor // the scales are read: a file's may not convert
			if ck.Generated() {  // made by construction: reading them would make their weights
				check = func(n string, i safetensors.TensorInfo) ([]float32, []int, error) {
					_, want, err := ck.scaleLoc(n, i)
					return nil, want, err
				}
			}
			if _, _, err := check(spec.Name, loc.info); err != nil {
				errs = append(errs, err)
			}
		default:
			errs = append(errs, fmt.Errorf("tensor %s: dtype %s, want a float type (BF16, F16, F32 or F8_E4M3)", spec.Name, loc.info.DType))
		}
	}
	if len(errs) > maxReportedError {
		more := len(errs) - maxReportedError
		errs = append(errs[:maxReportedError], fmt.Errorf("… and %d more problems", more))
	}
	return errors.Join(errs...)
}

// Close releases every open safetensors file.
func (ck *Checkpoint) Close() error {
	var errs []error
	for _, f := range ck.files {
		errs = append(errs, f.Close())
	}
	ck.files = nil
	return errors.Join(errs...)
}

// WeightsMode is how the checkpoint's files are held (OpenOptions.Weights).
func (ck *Checkpoint) WeightsMode() safetensors.Mode { return ck.mode }

// CheckWeights says whether the weights may still be read: nil when they
// were copied into memory, and for mapped files that are still the ones
// opened and never faulted (safetensors.File.Check). Cheap (one fstat per
// file): the CPU backend asks it before every batch.
func (ck *Checkpoint) CheckWeights() error {
	for _, f := range ck.files {
		if err := f.Check(); err != nil {
			return fmt.Errorf("checkpoint %s: %w", ck.dir, err)
		}
	}
	return nil
}

// VerifyWeights is CheckWeights plus each mapped file's header re-read and
// compared with the one loaded (safetensors.File.VerifyHeader).
func (ck *Checkpoint) VerifyWeights() error {
	for _, f := range ck.files {
		if err := f.VerifyHeader(); err != nil {
			return fmt.Errorf("checkpoint %s: %w", ck.dir, err)
		}
	}
	return nil
}

// DropResident releases the mapped files' pages from the resident set
// (safetensors.File.DropResident): tensors read in place since come back
// from the page cache when touched; ones only copied out stay out.
func (ck *Checkpoint) DropResident() error {
	var errs []error
	for _, f := range ck.files {
		errs = append(errs, f.DropResident())
	}
	return errors.Join(errs...)
}

// checkScales reports the non-finite block scales of the F8_E4M3 weight
// name, naming the scale tensor and the first bad block.
func (ck *Checkpoint) checkScales(name string, info safetensors.TensorInfo) error {
	scale, shape, err := ck.scaleFor(name, info)
	if err != nil {
		return err
	}
	bad, first := 0, -1
	for i, x := range scale {
		if x != x || math.IsInf(float64(x), 0) {
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	if bad == 0 {
		return nil
	}
	return fmt.Errorf("tensor %s: %d non-finite block scales (the first, block [%d, %d] of %s, is %v)", ScaleName(name), bad, first/shape[1], first%shape[1], name, scale[first])
}

// CheckTensors reads every float tensor of the checkpoint (dequantized, as
// the engine would see it) and reports those holding NaN or infinite
// values, like llama.cpp's --check-tensors. It reads the whole checkpoint:
// an optional load-time check.
func (ck *Checkpoint) CheckTensors() error {
	var errs []error
	for _, name := range ck.Names() {
		info := ck.tensors[name].info
		if !info.DType.IsFloat() || strings.HasSuffix(name, ScaleSuffix) && ck.Has(strings.TrimSuffix(name, ScaleSuffix)) {
			continue // a block scale is checked with its weight (checkScales)
		}
		if info.DType == safetensors.F8E4M3 {
			// a non-finite block scale is the scale tensor's fault, named
			// as such; its weight's values are then non-finite only
			// because of it (issue 37: the weight was blamed)
			if err := ck.checkScales(name, info); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		v, err := ck.Float32(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		bad, first := 0, -1
		for i, x := range v {
			if x != x || math.IsInf(float64(x), 0) {
				if first < 0 {
					first = i
				}
				bad++
			}
		}
		if bad > 0 {
			errs = append(errs, fmt.Errorf("tensor %s: %d non-finite values (the first at element %d is %v)", name, bad, first, v[first]))
		}
		if len(errs) > maxReportedError {
			errs = append(errs[:maxReportedError], errors.New("… and more"))
			break
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("checkpoint %s: tensor check failed: %w", ck.where(), errors.Join(errs...))
	}
	return nil
}
