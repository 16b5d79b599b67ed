package ir

import "fmt"

// The ops of the DFlash block drafter (z-lab's DFlashDraftModel) and of the
// trunk's capture of the hidden rows it reads.
const (
	// OpDFlashAttn is one DFlash draft layer's attention over its draft
	// K/V cache, the new context rows and the block rows (see its Doc and
	// inferDFlashAttn).
	OpDFlashAttn = "dflash_attn"
	// OpConcatCols concatenates activations of equal row counts along
	// their last dimension (the trunk's target-layer hidden rows).
	OpConcatCols = "concat_cols"
)

var dflashAttrs = []AttrDef{
	AttrHeads.Required("query heads Hq"),
	AttrKVHeads.Required("key/value heads Hkv (dividing Hq: query head h reads K/V head h/(Hq/Hkv))"),
	AttrHeadDim.Required("the head width hd (even: RoPE rotates its halves)"),
	AttrEps.Required("the per-head q/k RMSNorm's epsilon (> 0)"),
	AttrRopeTheta.Required("RoPE's base θ (> 0): inv_freq_i = θ^(−2i/hd), i < hd/2, rotate_half form"),
	AttrBlock.Required("the block size B (≥ 1): every sequence has exactly B block rows"),
}

func init() {
	for _, d := range []OpDef{
		{Name: OpDFlashAttn, Doc: "DFlash draft attention: per sequence, q/k per-head RMSNorm + RoPE, the new context rows' K/V appended to the layer's draft cache, the block's B queries attending non-causally to every cached context key and the B block keys (block K/V not cached)",
			MinInputs: 8, MaxInputs: 8, Infer: inferDFlashAttn, SideEffects: true, Attrs: dflashAttrs},
		{Name: OpConcatCols, Doc: "activations [rows, w_i] concatenated along the last dim → [rows, Σ w_i] (rows equal)", MinInputs: 1, MaxInputs: -1, Infer: inferConcatCols},
	} {
		MustRegister(d)
	}
}

// dflash_attn(batch, q, kb, vb, kc, vc, q_norm, k_norm) → o.
//
// batch is the host batch metadata (per sequence s its draft-cache slot,
// the L_s context positions the slot holds, c_s new context rows and B
// block rows). q [T, Hq·hd], kb and vb [T, Hkv·hd] are the block rows'
// projections (T = S·B); kc and vc [C, Hkv·hd] the new context rows'
// (C = Σ c_s); q_norm and k_norm [hd] the per-head RMSNorm weights.
// Sequence s's context rows take positions L_s..L_s+c_s−1 and its block
// rows L_s+c_s..L_s+c_s+B−1. Per head, q and k rows are RMS-normalized (eps,
// in fp32) then rotated (RoPE, rope_theta, rotate_half form); v is not.
// The context rows' normed and rotated K and V are appended to the layer's
// draft cache of s (its length grows by c_s); the block rows' are not
// cached. Every block query of s (head h, K/V head h/(Hq/Hkv)) attends
// non-causally to the L_s+c_s cached keys and the B block keys of s,
// scale hd^−½, softmax in fp32. o is [T, Hq·hd].
func inferDFlashAttn(n *Node) ([]OutType, error) {
	if _, err := need(n, 0, Host, -1); err != nil {
		return nil, err
	}
	Hq, Hkv, hd := AttrHeads.Get(n), AttrKVHeads.Get(n), AttrHeadDim.Get(n)
	if Hq < 1 || Hkv < 1 || hd < 1 {
		return nil, fmt.Errorf("attributes heads, kv_heads and head_dim must be ≥ 1")
	}
	if Hq%Hkv != 0 {
		return nil, fmt.Errorf("attribute kv_heads (%d) must divide heads (%d)", Hkv, Hq)
	}
	if hd%2 != 0 {
		return nil, fmt.Errorf("attribute head_dim (%d) must be even (RoPE rotates its halves)", hd)
	}
	if AttrEps.Get(n) <= 0 {
		return nil, fmt.Errorf("attribute eps must be > 0")
	}
	if AttrRopeTheta.Get(n) <= 0 {
		return nil, fmt.Errorf("attribute rope_theta must be > 0")
	}
	if AttrBlock.Get(n) < 1 {
		return nil, fmt.Errorf("attribute block must be ≥ 1")
	}
	rows := []struct {
		name  string
		dim   int
		width int
	}{{"q", DimT, Hq * hd}, {"k (block)", DimT, Hkv * hd}, {"v (block)", DimT, Hkv * hd}, {"k (context)", DimC, Hkv * hd}, {"v (context)", DimC, Hkv * hd}}
	for i, r := range rows {
		x, err := need(n, i+1, F32, 2)
		if err != nil {
			return nil, err
		}
		if x.Shape[0] != r.dim || x.Shape[1] != r.width {
			return nil, fmt.Errorf("input %d (%s, %s) is %s, want %s", i+1, r.name, x.Name, FormatShape(x.DType, x.Shape), FormatShape(F32, []int{r.dim, r.width}))
		}
	}
	for i, name := range []string{"q_norm", "k_norm"} {
		w, err := need(n, 6+i, F32, 1)
		if err != nil {
			return nil, err
		}
		if w.Shape[0] != hd {
			return nil, fmt.Errorf("input %d (%s weight %s) has %d elements, want head_dim %d", 6+i, name, w.Name, w.Shape[0], hd)
		}
	}
	return []OutType{out("o", F32, DimT, Hq*hd)}, nil
}

func inferConcatCols(n *Node) ([]OutType, error) {
	first, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	w := 0
	for i := range n.Inputs {
		x, err := need(n, i, F32, 2)
		if err != nil {
			return nil, err
		}
		if x.Shape[0] != first.Shape[0] {
			return nil, fmt.Errorf("input %d (%s) is %s, rows must match input 0's %s", i, x.Name, FormatShape(x.DType, x.Shape), FormatShape(first.DType, first.Shape))
		}
		w += x.Shape[1]
	}
	return []OutType{out("y", F32, first.Shape[0], w)}, nil
}

// The DFlash draft graph's typed property (Graph.DFlash), spelt as the
// graph attribute "dflash" in the text format and on the plugin wire.
const GraphAttrDFlash = "dflash"

// DFlash reports whether the graph is a DFlash drafter's draft graph
// (speculative decoding's block draft forward).
func (g *Graph) DFlash() bool { return g.isDFlash }

// SetDFlash makes the graph a DFlash draft graph.
func (g *Graph) SetDFlash() { g.isDFlash = true }
