package plan

import (
	"fmt"
	"sync"

	"github.com/glmflash/glmflash/core/ir"
)

// WeightCache memoizes a Weights source so that several plans (one per
// batch mode) share one copy of every tensor, stacked weight and bf16 copy.
// It is safe for concurrent use.
type WeightCache struct {
	src Weights
	mu  sync.Mutex
	m   map[string][]float32
	b   map[string][]uint16
}

// NewWeightCache wraps src (a WeightCache is returned as is).
func NewWeightCache(src Weights) *WeightCache {
	if c, ok := src.(*WeightCache); ok {
		return c
	}
	return &WeightCache{src: src, m: map[string][]float32{}, b: map[string][]uint16{}}
}

// Source returns the wrapped weight source.
func (c *WeightCache) Source() Weights { return c.src }

// stacked returns the shared stacked copy of a stacked weight (one per
// reference, whichever plan asks). The per-expert tensors it was built
// from are not kept.
func (c *WeightCache) stacked(v *ir.Value) ([]float32, error) {
	key := fmt.Sprintf("%s#%d", v.Ref, v.Stack)
	c.mu.Lock()
	if t, ok := c.m[key]; ok {
		c.mu.Unlock()
		return t, nil
	}
	c.mu.Unlock()
	t, err := stackWeights(c.src, v)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.m[key]; ok {
		return prev, nil
	}
	c.m[key] = t
	return t, nil
}

// bf16 returns the shared bfloat16 copy of a leaf weight (nil when it is
// not exactly representable).
func (c *WeightCache) bf16(ref string, stack int, w []float32) []uint16 {
	key := fmt.Sprintf("%s#%d", ref, stack)
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.b[key]; ok {
		return b
	}
	b := ToBF16Exact(w)
	c.b[key] = b
	return b
}

// Float32 returns the cached tensor, loading it on first use. The shape is
// checked on every call.
func (c *WeightCache) Float32(name string, shape ...int) ([]float32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.m[name]; ok {
		n := 1
		for _, d := range shape {
			n *= d
		}
		if len(shape) > 0 && n != len(t) {
			return nil, fmt.Errorf("tensor %s: %d elements cached, want shape %v", name, len(t), shape)
		}
		return t, nil
	}
	t, err := c.src.Float32(name, shape...)
	if err != nil {
		return nil, err
	}
	c.m[name] = t
	return t, nil
}

// Bytes is the host memory held by cached tensors.
func (c *WeightCache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, t := range c.m {
		n += int64(4 * len(t))
	}
	for _, t := range c.b {
		n += int64(2 * len(t))
	}
	return n
}
