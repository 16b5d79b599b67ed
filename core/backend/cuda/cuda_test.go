package cuda

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/glmflash/glmflash/core/plan"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/stretchr/testify/require"
)

// The arena plan never hands out overlapping live blocks, and its peak is
// the high-water mark of what was live at once.
func TestArenaPlanNoOverlap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for trial := 0; trial < 200; trial++ {
		a := &arenaPlan{}
		type blk struct{ off, n int64 }
		var live []blk
		var liveBytes, hwm int64
		for step := 0; step < 60; step++ {
			if len(live) > 0 && r.IntN(3) == 0 {
				i := r.IntN(len(live))
				a.release(live[i].off, live[i].n)
				liveBytes -= roundUp(live[i].n)
				live = append(live[:i], live[i+1:]...)
				continue
			}
			n := int64(1 + r.IntN(5000))
			off := a.alloc(n)
			require.Zero(t, off%align)
			for _, b := range live {
				require.False(t, off < b.off+roundUp(b.n) && b.off < off+roundUp(n), "block [%d,%d) overlaps [%d,%d)", off, off+n, b.off, b.off+b.n)
			}
			live = append(live, blk{off, n})
			liveBytes += roundUp(n)
			hwm = max(hwm, liveBytes)
			require.LessOrEqual(t, off+roundUp(n), a.peak, "a block ends past the peak")
		}
		require.GreaterOrEqual(t, a.peak, hwm)
	}
}

func TestConstKeyNamesDerivedWeights(t *testing.T) {
	g := ir.New("t")
	a := g.AddWeight("a.weight", 2, 3)
	b := g.AddWeight("b.weight", 2, 3)
	c := g.Op1(ir.OpConcatRows, 0, nil, a, b)
	require.Equal(t, "a.weight#0", plan.ConstKey(a))
	require.Equal(t, "concat_rows(a.weight#0,b.weight#0)", plan.ConstKey(c))
	// derived weights of one input that differ by attributes are different
	// constants (the MTP's two halves of eh_proj)
	lo := g.Op1(ir.OpSliceCols, 0, ir.NewAttrs(ir.AttrStart.Is(0), ir.AttrEnd.Is(2)), a)
	hi := g.Op1(ir.OpSliceCols, 0, ir.NewAttrs(ir.AttrStart.Is(2), ir.AttrEnd.Is(3)), a)
	require.Equal(t, `slice_cols{end=2, start=0}(a.weight#0)`, plan.ConstKey(lo))
	require.NotEqual(t, plan.ConstKey(lo), plan.ConstKey(hi))
}

// Where CUDA cannot run, opening the backend fails at once and names what
// is missing.
func TestOpenSaysWhatIsMissing(t *testing.T) {
	t.Setenv("GLMFLASH_CUDA_EMULATOR", "/nonexistent/libcuda-emulator.so")
	_, err := Open(backend.Options{})
	require.ErrorContains(t, err, "the CUDA emulator /nonexistent/libcuda-emulator.so")
	t.Setenv("GLMFLASH_CUDA_EMULATOR", "")
	if _, err := os.Stat("/dev/nvidia0"); err == nil {
		t.Skip("this machine has a GPU")
	}
	be, err := Open(backend.Options{})
	if err == nil {
		be.Close()
		t.Skip("CUDA opened (a driver without /dev/nvidia0?)")
	}
	require.Regexp(t, "no NVIDIA driver|no usable GPU|no GPU|no cuBLAS", err.Error())
	t.Logf("as reported: %v", err)
}

// Precision other than fp32 is refused by name.
func TestOpenRefusesUnknownPrecision(t *testing.T) {
	_, err := Open(backend.Options{Precision: "int4"})
	require.ErrorContains(t, err, `precision "int4"`)
}

// While a side branch is open nothing released is reused: blocks freed
// then come back only at the join.
func TestArenaPlanHoldsReleases(t *testing.T) {
	a := &arenaPlan{}
	x := a.alloc(1000)
	a.hold = true
	a.release(x, 1000)
	y := a.alloc(1000)
	require.NotEqual(t, x, y, "a block released during the hold was reused")
	a.flush()
	require.Equal(t, x, a.alloc(1000), "the join releases what the hold deferred")
}

// streamPlan: side steps fork before the first of them; the first main
// step reading a side output joins; a side step reading a main output
// from after the fork joins and forks again; what is open at the end is
// joined by the extra last entry.
func TestStreamPlan(t *testing.T) {
	g := ir.New("streams")
	h := g.AddInput("h", ir.F32, ir.DimT, 4)
	var steps []*kstep
	add := func(side bool, in ...*ir.Value) *ir.Value {
		var attrs ir.Attrs
		if side {
			attrs = ir.NewAttrs(ir.AttrStream.Is(1))
		}
		n, err := g.NewNode(ir.OpSigmoid, 0, attrs, in[0])
		require.NoError(t, err)
		n.Inputs = in
		steps = append(steps, &kstep{node: n})
		return n.Outputs[0]
	}
	s1 := add(true, h)      // 0: fork, side
	m1 := add(false, h)     // 1: main, beside s1
	s2 := add(true, s1)     // 2: side
	m2 := add(false, m1)    // 3: main
	j := add(false, m2, s2) // 4: join
	s3 := add(true, j)      // 5: fork again
	add(true, s3, m2)       // 6: side, reads a main value from before the fork
	m3 := add(false, j)     // 7: main
	add(true, m3)           // 8: reads main output from after the fork: join, fork
	acts := streamPlan(steps)
	want := []streamAct{
		{fork: true, side: true}, {}, {side: true}, {}, {join: true},
		{fork: true, side: true}, {side: true}, {}, {join: true, fork: true, side: true},
		{join: true},
	}
	require.Equal(t, want, acts)
	_ = m2
}

// A layout, walked once over the plan's liveness events, never overlaps
// two values (or a step's scratch) live at once, keeps a side branch's
// releases until its join, and is planned once per batch shape.
func TestLayoutPerShape(t *testing.T) {
	g := ir.New("layout")
	h := g.AddInput("h", ir.F32, ir.DimT, 4)
	var steps []*kstep
	var nodes []*ir.Node
	add := func(side bool, width int, in ...*ir.Value) *ir.Value {
		var attrs ir.Attrs
		if side {
			attrs = ir.NewAttrs(ir.AttrStream.Is(1))
		}
		n, err := g.NewNode(ir.OpSigmoid, 0, attrs, in[0])
		require.NoError(t, err)
		n.Inputs = in
		n.Outputs[0].Shape = []int{ir.DimT, width}
		st := &kstep{node: n}
		if width == 100 { // a step with scratch
			st.temps = func(rc *runCtx) []int64 { return []int64{int64(1000 * rc.T), 10} }
		}
		steps, nodes = append(steps, st), append(nodes, n)
		return n.Outputs[0]
	}
	a := add(false, 64, h)
	s1 := add(true, 300, a)     // side, beside b
	b := add(false, 100, a)     // scratch released while the branch is open
	b2 := add(false, 64, b)     // born while it is open: reuses none of it
	c := add(false, 64, b2, s1) // joins
	d := add(false, 64, c)
	out := add(false, 8, d, a)
	lastUse := map[*ir.Value]int{}
	for si, n := range nodes {
		for _, in := range n.Inputs {
			lastUse[in] = si
		}
	}
	lastUse[out] = math.MaxInt
	p := &Program{plan: &plan.Plan{Life: plan.NewLiveness(nodes, lastUse)}, steps: steps, streams: streamPlan(steps), layouts: map[layoutKey]*layout{}}
	for _, e := range p.plan.Life.Events {
		p.maxID = max(p.maxID, e.Value.ID)
	}
	for _, T := range []int{1, 3, 17} {
		rc := &runCtx{p: p, T: T, S: 1, R: 1, maxVisible: map[int]int{}}
		lay := p.layoutOf(rc)
		require.Same(t, lay, p.layoutOf(rc), "a shape seen before plans nothing")
		// live ranges [born, dies] by step; a side value stays live until the join (step 3)
		type blk struct {
			off, end  int64
			from, too int
		}
		var blks []blk
		for si := range steps {
			for _, e := range p.plan.Life.Born(si) {
				to := math.MaxInt
				if u, ok := lastUse[e.Value]; ok && u != math.MaxInt {
					to = u
				}
				off := lay.off[e.Value.ID]
				require.GreaterOrEqual(t, off, int64(0))
				blks = append(blks, blk{off, off + roundUp(rc.bytesOf(e.Value)), si, to})
			}
			for i, off := range lay.tempOff[si] {
				blks = append(blks, blk{off, off + roundUp(lay.tempSize[si][i]), si, si})
			}
		}
		for i := range blks { // what dies while the side branch is open (steps 1–3) is held until the join at 4
			if blks[i].from >= 1 && blks[i].from <= 3 {
				blks[i].too = max(blks[i].too, 3)
			}
		}
		for i, x := range blks {
			require.LessOrEqual(t, x.end, lay.peak)
			for _, y := range blks[:i] {
				live := x.from <= y.too && y.from <= x.too
				require.False(t, live && x.off < y.end && y.off < x.end, "T=%d: [%d,%d) steps %d–%d overlaps [%d,%d) steps %d–%d", T, x.off, x.end, x.from, x.too, y.off, y.end, y.from, y.too)
			}
		}
	}
	require.Len(t, p.layouts, 3)
	// the DSA pools a batch sees are part of the key
	p.kpoolSizes = []int{64}
	rc := &runCtx{p: p, T: 1, S: 1, R: 1, maxVisible: map[int]int{64: 2}}
	lay := p.layoutOf(rc)
	rc.maxVisible[64] = 3
	require.NotSame(t, lay, p.layoutOf(rc))
	_ = out
}

// The CUDA options travel in backend.Options.Device; options of another
// backend (or none) read as the zero Options.
func TestOptionsOf(t *testing.T) {
	require.Equal(t, Options{}, OptionsOf(backend.Options{}))
	o := Options{DeviceIndex: 1, GraphMaxTokens: -1, ProfileOps: true}
	require.Equal(t, o, OptionsOf(backend.Options{Device: o}))
	require.Equal(t, Options{}, OptionsOf(backend.Options{Device: otherDevice{}}))
	require.Equal(t, "cuda", o.Backend())
}

type otherDevice struct{}

func (otherDevice) Backend() string { return "other" }
