package randckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Options control Write.
type Options struct {
	// Seed selects the random weights; the same seed gives the same bytes.
	Seed int64
	// FP8 writes the FP8 layout of the released checkpoint: the FP8-eligible
	// modules (architecture §2.3) as float8 e4m3fn with 128×128 block scales
	// ("<name>_scale_inv", F32) and a quantization_config in config.json.
	FP8 bool
	// ShardBytes, when positive, splits the tensor data into shards of at
	// most this many bytes (a larger single tensor gets a shard of its own),
	// named model-0000i-of-0000n.safetensors, with a
	// model.safetensors.index.json. 0 always writes one model.safetensors.
	ShardBytes int64
}

// unit is a weight plus, for FP8 weights, its block scale: they are generated
// together and always land in the same shard.
type unit struct {
	weight model.WeightSpec
	scale  *model.WeightSpec
}

func (u unit) bytes() int64 {
	n := specBytes(u.weight)
	if u.scale != nil {
		n += specBytes(*u.scale)
	}
	return n
}

func specBytes(s model.WeightSpec) int64 {
	n := int64(s.DType.Size())
	for _, d := range s.Shape {
		n *= int64(d)
	}
	return n
}

// Write writes a random checkpoint for cfg into dir (created if needed):
// config.json in the released nested shape, a byte-level BPE tokenizer
// sized to the vocabulary (WriteTokenizer), and the weights of
// cfg.WeightCatalog(opts.FP8) and, when the config declares MTP layers,
// cfg.MTPWeightCatalog(opts.FP8) in one or more safetensors files. Any previous
// model.safetensors, index and shard files in dir are removed first.
//
// Values follow hf_fixture.py randomize(); every non-FP8 value is rounded to
// bfloat16 (F32 tensors too), as in the fixture. With FP8, each 128×128 block
// of an FP8 weight gets the scale 2^ceil(log2(amax/448)) (a power of two
// rather than exactly amax/448) and codes = e4m3(w/scale). With a power-of-two
// scale, every dequantized value code·scale has at most 4 significant bits,
// so it is exactly representable in bfloat16: a BF16 copy of the dequantized
// weights (WriteDequantizedBF16) holds the very same numbers.
//
// Generation is deterministic for a seed and independent of GOMAXPROCS and
// sharding: every tensor draws from its own PCG streams, keyed by the seed,
// its name and the chunk index.
func Write(dir string, cfg *model.Config, opts Options) error {
	if cfg == nil {
		return errors.New("randckpt: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	cfg = withLayout(cfg, opts.FP8)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	if err := removeWeights(dir); err != nil {
		return err
	}
	cfgJSON, err := cfg.MarshalHF()
	if err != nil {
		return fmt.Errorf("randckpt: config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, model.ConfigFile), cfgJSON, 0o644); err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	if err := WriteTokenizer(dir, cfg.VocabSize); err != nil {
		return fmt.Errorf("randckpt: tokenizer: %w", err)
	}

	units := unitsOf(cfg, opts.FP8)
	var total int64
	for _, u := range units {
		total += u.bytes()
	}
	shards := [][]unit{units}
	if opts.ShardBytes > 0 && total > opts.ShardBytes {
		shards = nil
		var cur []unit
		var curBytes int64
		for _, u := range units {
			if len(cur) > 0 && curBytes+u.bytes() > opts.ShardBytes {
				shards = append(shards, cur)
				cur, curBytes = nil, 0
			}
			cur = append(cur, u)
			curBytes += u.bytes()
		}
		shards = append(shards, cur)
	}
	g := &generator{seed: uint64(opts.Seed), block: cfg.BlockSize()}
	if len(shards) == 1 {
		return g.writeFile(filepath.Join(dir, model.SingleFile), shards[0])
	}
	weightMap := map[string]string{}
	for i, sh := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		if err := g.writeFile(filepath.Join(dir, name), sh); err != nil {
			return err
		}
		for _, u := range sh {
			weightMap[u.weight.Name] = name
			if u.scale != nil {
				weightMap[u.scale.Name] = name
			}
		}
	}
	idx, err := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}, "", "  ")
	if err != nil {
		return fmt.Errorf("randckpt: index: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, model.IndexFile), append(idx, '\n'), 0o644); err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	return nil
}

// removeWeights deletes weight files a previous Write may have left in dir.
func removeWeights(dir string) error {
	old, err := filepath.Glob(filepath.Join(dir, "model-*-of-*.safetensors"))
	if err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	old = append(old, filepath.Join(dir, model.SingleFile), filepath.Join(dir, model.IndexFile))
	for _, p := range old {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("randckpt: %w", err)
		}
	}
	return nil
}

type generator struct {
	seed  uint64
	block [2]int
}

func (g *generator) writeFile(path string, units []unit) error {
	var specs []safetensors.WriteTensor
	for _, u := range units {
		specs = append(specs, safetensors.WriteTensor{Name: u.weight.Name, DType: u.weight.DType, Shape: u.weight.Shape})
		if u.scale != nil {
			specs = append(specs, safetensors.WriteTensor{Name: u.scale.Name, DType: u.scale.DType, Shape: u.scale.Shape})
		}
	}
	w, err := safetensors.NewWriter(path, specs, map[string]string{"format": "pt"})
	if err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	// Generate the next tensor while the previous one is being written.
	type result struct {
		data, scale []byte
		err         error
	}
	results := make(chan result, 1)
	stop := make(chan struct{})
	go func() {
		defer close(results)
		for _, u := range units {
			data, scale, err := g.tensor(u)
			select {
			case results <- result{data, scale, err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	fail := func(err error) error {
		close(stop)
		for range results { // let the generator finish
		}
		w.Abort()
		return fmt.Errorf("randckpt: %w", err)
	}
	for _, u := range units {
		r, ok := <-results
		if !ok {
			return fail(fmt.Errorf("tensor %s was not generated", u.weight.Name))
		}
		err := r.err
		if err == nil {
			err = w.WriteTensor(u.weight.Name, r.data)
		}
		if err == nil && u.scale != nil {
			err = w.WriteTensor(u.scale.Name, r.scale)
		}
		if err != nil {
			return fail(err)
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	return nil
}

// dist is a value distribution: normal(mean, std) or uniform[lo, hi).
type dist struct {
	uniform   bool
	mean, std float64 // normal
	lo, hi    float64 // uniform
}

func normal(mean, std float64) dist { return dist{mean: mean, std: std} }

// distFor mirrors hf_fixture.py randomize(), translated to checkpoint names.
func distFor(name string, shape []int) dist {
	fanIn := func() float64 {
		if len(shape) >= 2 && shape[len(shape)-1] > 0 {
			return 1 / math.Sqrt(float64(shape[len(shape)-1]))
		}
		return 0.1
	}
	isHC := strings.Contains(name, ".hc_attn_") || strings.Contains(name, ".hc_ffn_")
	switch {
	case strings.HasSuffix(name, "A_log"):
		return normal(0, 0.5)
	case strings.HasSuffix(name, "dt_bias"):
		return normal(0, 1)
	case strings.Contains(name, "conv1d"):
		return normal(0, 0.5)
	case isHC && strings.HasSuffix(name, "_base"):
		return normal(0, 0.5)
	case isHC && strings.HasSuffix(name, "_scale"):
		return dist{uniform: true, lo: 0.5, hi: 1.5}
	case isHC && strings.HasSuffix(name, "_fn"):
		return normal(0, fanIn())
	case strings.Contains(name, "index_kpool_compress_ape"):
		return normal(0, 0.5)
	case strings.Contains(name, "index_kpool_compress_gate"):
		return normal(0, fanIn())
	case strings.Contains(name, "norm") && len(shape) == 1:
		if strings.HasSuffix(name, "bias") {
			return normal(0, 0.1)
		}
		return normal(1, 0.1)
	case strings.Contains(name, "embed_tokens"):
		return normal(0, 1)
	case strings.HasSuffix(name, "e_score_correction_bias"):
		return normal(0, 0.05)
	case len(shape) == 2:
		return normal(0, fanIn())
	default:
		return normal(0, 0.1)
	}
}

// chunkElems is the number of elements drawn from one PCG stream.
const chunkElems = 1 << 16

func nameHash(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// parallelFor runs f(i) for i in [0, n) on GOMAXPROCS goroutines.
func parallelFor(n int, f func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := 0; i < n; i++ {
			f(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}

// generate draws the n values of a tensor chunk by chunk (in parallel) and
// hands each chunk to sink with the offset of its first element. Chunk c
// always draws the same values, whatever the parallelism.
func (g *generator) generate(name string, shape []int, n int, sink func(off int, part []float32)) {
	d := distFor(name, shape)
	h := nameHash(name)
	chunks := (n + chunkElems - 1) / chunkElems
	var pool sync.Pool
	parallelFor(chunks, func(c int) {
		bp, _ := pool.Get().(*[]float32)
		if bp == nil {
			b := make([]float32, chunkElems)
			bp = &b
		}
		part := (*bp)[:min(chunkElems, n-c*chunkElems)]
		r := rand.New(rand.NewPCG(g.seed^h, uint64(c)*0x9e3779b97f4a7c15+h))
		if d.uniform {
			for i := range part {
				part[i] = float32(d.lo + (d.hi-d.lo)*r.Float64())
			}
		} else {
			for i := range part {
				part[i] = float32(d.mean + d.std*r.NormFloat64())
			}
		}
		sink(c*chunkElems, part)
		pool.Put(bp)
	})
}

// fill draws the values of a tensor into vals.
func (g *generator) fill(name string, shape []int, vals []float32) {
	g.generate(name, shape, len(vals), func(off int, part []float32) { copy(vals[off:], part) })
}

// tensor generates the bytes of a unit: the weight and, for FP8, its scales.
func (g *generator) tensor(u unit) (data, scale []byte, err error) {
	data = make([]byte, specBytes(u.weight))
	if u.scale != nil {
		scale = make([]byte, specBytes(*u.scale))
	}
	if err := g.fillUnit(u, data, scale); err != nil {
		return nil, nil, err
	}
	return data, scale, nil
}

// pow2Scale returns the smallest power of two p with amax/p ≤ 448 (1 for amax 0).
func pow2Scale(amax float32) float32 {
	a := float64(amax)
	if !(a > 0) || math.IsInf(a, 0) {
		return 1
	}
	_, e := math.Frexp(a / safetensors.F8E4M3Max)
	p := math.Ldexp(1, e)
	for a/p > safetensors.F8E4M3Max {
		p *= 2
	}
	for a/(p/2) <= safetensors.F8E4M3Max {
		p /= 2
	}
	return float32(p)
}
