package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/glmflash/glmflash/core/sample"
	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/stretchr/testify/require"
)

// procRow is one row of a logits-processing case: its raw logits, edits,
// allow mask (nil: none) and how it is sampled.
type procRow struct {
	logits []float32
	edits  []sample.Edit
	allow  []uint32
	p      sample.Params
	u      float64
	ntop   int
}

// procRows are rows with every kind of processing on a vocabulary of V
// ids: none, edits only (penalties, biases, bans, edits of non-finite raw
// logits), a mask only (random, nearly empty, a single token), both, and
// edits and cleared bits at chunk boundaries; greedy and sampled.
func procRows(r *rand.Rand, V int) []procRow {
	W := sample.AllowWords(V)
	mask := func(keep float64) []uint32 {
		m := make([]uint32, W)
		for i := 0; i < V; i++ {
			if r.Float64() < keep {
				m[i>>5] |= 1 << (uint(i) & 31)
			}
		}
		return m
	}
	only := func(toks ...int) []uint32 {
		m := make([]uint32, W)
		for _, t := range toks {
			m[t>>5] |= 1 << (uint(t) & 31)
		}
		return m
	}
	edits := func(n int) []sample.Edit {
		seen := map[int32]bool{}
		var e []sample.Edit
		for len(e) < n {
			t := int32(r.IntN(V))
			if seen[t] {
				continue
			}
			seen[t] = true
			ed := sample.Edit{Token: t, Penalty: 1, Add: float32(r.NormFloat64() * 3)}
			switch r.IntN(5) {
			case 0:
				ed.Penalty = 1 + float32(r.Float64()*2) // repetition penalty
			case 1:
				ed.Add = float32(math.Inf(-1)) // a ban
			case 2:
				ed.Penalty, ed.Add = 0.5, 100 // logit_bias +100 after a penalty below 1
			}
			e = append(e, ed)
		}
		sortEdits(e)
		return e
	}
	params := []sample.Params{sample.Greedy(), {Temperature: 1, TopP: 1}, {Temperature: 0.7, TopP: 0.9}, {Temperature: 1.3, TopK: 40, TopP: 1}, {Temperature: 0.5, TopP: 0.8, MinP: 0.05}}
	var rows []procRow
	add := func(e []sample.Edit, m []uint32) {
		i := len(rows)
		rows = append(rows, procRow{logits: randn(r, V, 2), edits: e, allow: m, p: params[i%len(params)], u: r.Float64(), ntop: i % 4})
	}
	for k := 0; k < 2; k++ {
		add(nil, nil)
		add(edits(1+r.IntN(40)), nil)
		add(nil, mask(0.5))
		add(edits(1+r.IntN(40)), mask(0.3))
		add(nil, only(V-1, 3, 700))
		add(edits(60), only(int(r.IntN(V))))
	}
	// edits and bans at the chunk boundaries the tests cut (96, 128) and
	// the mask's partial last word
	bound := []sample.Edit{{Token: 95, Penalty: 2, Add: 1}, {Token: 96, Add: float32(math.Inf(-1))}, {Token: 127, Penalty: 1.5}, {Token: 128, Add: 5}, {Token: 191, Add: -3}, {Token: 192, Penalty: 3}, {Token: int32(V - 1), Add: 7}}
	add(bound, nil)
	add(bound, mask(0.9))
	// every token but one banned by edits
	var all []sample.Edit
	for t := 0; t < V; t++ {
		if t != 500 {
			all = append(all, sample.Edit{Token: int32(t), Add: float32(math.Inf(-1))})
		}
	}
	add(all, nil)
	// a draw at the top of [0, 1) over three allowed tokens: the
	// fall-through must be an allowed token, never a banned one of
	// probability 0
	for _, p := range []sample.Params{{Temperature: 1, TopP: 1}, {Temperature: 0.8, TopP: 0.95, MinP: 0.01}, {Temperature: 2, TopK: 500, TopP: 1}} {
		rows = append(rows, procRow{logits: randn(r, V, 1), allow: only(10, 20, 999), p: p, u: math.Nextafter(1, 0), ntop: 2})
		rows = append(rows, procRow{logits: randn(r, V, 1), edits: edits(3), allow: only(5, 6), p: p, u: math.Nextafter(1, 0)})
	}
	return rows
}

func sortEdits(e []sample.Edit) {
	for i := 1; i < len(e); i++ {
		for j := i; j > 0 && e[j].Token < e[j-1].Token; j-- {
			e[j], e[j-1] = e[j-1], e[j]
		}
	}
}

// procUpload uploads rows' logits and specs (edits and masks in buffers of
// their own, the specs pointing at them).
func procUpload(t testing.TB, d *kc.Device, rows []procRow) (L, S buf) {
	var logits []float32
	var edits []kc.LogitEdit
	var masks []uint32
	type at struct{ e, m int }
	ats := make([]at, len(rows))
	for i, r := range rows {
		logits = append(logits, r.logits...)
		ats[i] = at{len(edits), len(masks)}
		for _, e := range r.edits {
			edits = append(edits, kc.LogitEdit{Token: int64(e.Token), Penalty: float64(e.Penalty), Add: float64(e.Add)})
		}
		masks = append(masks, r.allow...)
	}
	E, M := upload(t, d, append(edits, kc.LogitEdit{})), upload(t, d, append(masks, 0))
	specs := make([]kc.SampleSpec, len(rows))
	for i, r := range rows {
		specs[i] = kc.SampleSpec{Temperature: r.p.Temperature, TopP: r.p.TopP, MinP: r.p.MinP, U: r.u, TopK: int64(r.p.TopK), NTop: int64(r.ntop)}
		if len(r.edits) > 0 {
			specs[i].Edits, specs[i].NEdits = E.p+kc.DevicePtr(ats[i].e*int(unsafe.Sizeof(kc.LogitEdit{}))), int64(len(r.edits))
		}
		if r.allow != nil {
			specs[i].Allow = M.p + kc.DevicePtr(4*ats[i].m)
		}
	}
	return upload(t, d, logits), upload(t, d, specs)
}

// glmf_logits_process writes exactly core/sample.Apply's row (bit for bit:
// edits, bans, the mask, raw non-finite values left alone) for every
// processed row, and nothing for the others; chunked finely, so edits and
// cleared bits fall on chunk boundaries.
func TestLogitsProcessMatchesApply(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(31, 32))
	V := 1000
	rows := procRows(r, V)
	// raw non-finite values under an edit, a cleared bit and neither
	rows[3].logits[rows[3].edits[0].Token] = float32(math.NaN())
	rows[2].logits[1] = float32(math.Inf(-1))
	rows[2].allow[0] &^= 1 << 1
	rows[2].logits[2] = float32(math.Inf(1))
	L, S := procUpload(t, d, rows)
	for _, tc := range []struct {
		name           string
		threads, chunk int64
	}{{"backend-chunks", 256, 2048}, {"chunks-of-128", 32, 128}, {"chunks-of-96", 32, 96}} {
		t.Run(tc.name, func(t *testing.T) {
			nc := (int64(V) + tc.chunk - 1) / tc.chunk
			O := poisoned[float32](t, d, len(rows)*V)
			a := kc.LogitsProcessArgs{Logits: L.p, Vocab: int64(V), Rows: int64(len(rows)), Chunk: tc.chunk, Nchunks: nc, Specs: S.p, Out: O.p}
			launch(t, d, kc.KernelLogitsProcess, kc.Dim3{X: uint32(nc), Y: uint32(len(rows))}, kc.Dim3{X: uint32(tc.threads)}, 0, &a)
			got := download[float32](t, O)
			for i, row := range rows {
				g := got[i*V : (i+1)*V]
				if len(row.edits) == 0 && row.allow == nil {
					for j, v := range g {
						require.Equal(t, uint32(0xFFFFFFFF), math.Float32bits(v), "row %d (unprocessed) token %d was written", i, j)
					}
					continue
				}
				want := append([]float32(nil), row.logits...)
				sample.Apply(want, row.edits, row.allow)
				for j := range want {
					require.Equal(t, math.Float32bits(want[j]), math.Float32bits(g[j]), "row %d token %d: got %v, want %v (raw %v)", i, j, g[j], want[j], row.logits[j])
				}
			}
		})
	}
}

// The device sampler on processed rows picks what the host's sampler picks
// from sample.Apply's row for the same draw (greedy and sampled rows with
// edits, masks, both and none) and reports its log-probabilities; a draw
// at the top of [0, 1) never falls through to a banned token; a processed
// row whose raw logits hold a NaN is reported, with the raw count.
func TestSampleProcessedMatchesHost(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(41, 42))
	V := 1000
	rows := procRows(r, V)
	bad := procRow{logits: randn(r, V, 1), edits: []sample.Edit{{Token: 17, Add: float32(math.Inf(-1))}}, allow: make([]uint32, sample.AllowWords(V)), p: sample.Params{Temperature: 1, TopP: 1}}
	bad.logits[17], bad.logits[500] = float32(math.NaN()), float32(math.Inf(1))
	rows = append(rows, bad)
	L, S := procUpload(t, d, rows)
	R := len(rows)
	for _, tc := range []struct {
		name           string
		threads, chunk int64
	}{{"backend-chunks", 256, 2048}, {"chunks-of-128", 32, 128}} {
		t.Run(tc.name, func(t *testing.T) {
			nc := (int64(V) + tc.chunk - 1) / tc.chunk
			Pr := poisoned[float32](t, d, R*V)
			pa := kc.LogitsProcessArgs{Logits: L.p, Vocab: int64(V), Rows: int64(R), Chunk: tc.chunk, Nchunks: nc, Specs: S.p, Out: Pr.p}
			grid := kc.Dim3{X: uint32(nc), Y: uint32(R)}
			launch(t, d, kc.KernelLogitsProcess, grid, kc.Dim3{X: uint32(tc.threads)}, 0, &pa)
			P := poisoned[kc.SamplePart](t, d, R*int(nc))
			sa := kc.SamplePartArgs{Logits: L.p, Vocab: int64(V), Rows: int64(R), Chunk: tc.chunk, Nchunks: nc, Specs: S.p, Parts: P.p, Processed: Pr.p}
			launch(t, d, kc.KernelSamplePart, grid, kc.Dim3{X: uint32(tc.threads)}, 0, &sa)
			O, M := poisoned[kc.SampleOut](t, d, R), poisoned[uint64](t, d, R*V)
			a := kc.SampleArgs{Logits: L.p, Vocab: int64(V), Rows: int64(R), Specs: S.p, Out: O.p, Mass: M.p, Parts: P.p, Nchunks: nc, Processed: Pr.p}
			launch(t, d, kc.KernelSample, kc.Dim3{X: uint32(R)}, kc.Dim3{X: 256}, 0, &a)
			outs := download[kc.SampleOut](t, O)
			for i, row := range rows[:R-1] {
				proc := append([]float32(nil), row.logits...)
				sample.Apply(proc, row.edits, row.allow)
				tok := int32(sample.Pick(proc, row.p, row.u))
				lp, top := sample.Logprobs(proc, tok, row.ntop)
				o := outs[i]
				require.Zero(t, o.Nonfinite, "row %d", i)
				require.Equal(t, tok, int32(o.Token), "row %d (%+v, u %v)", i, row.p, row.u)
				require.True(t, sample.Allowed(row.allow, tok), "row %d picked a masked token %d", i, tok)
				require.InDelta(t, lp, float32(o.TokLogit-o.Lse), 1e-5, "row %d", i)
				require.EqualValues(t, len(top), o.NTop, "row %d", i)
				for j, tl := range top {
					require.Equal(t, tl.ID, int32(o.TopId[j]), "row %d alt %d", i, j)
					require.InDelta(t, tl.Logprob, float32(o.TopLogit[j]-o.Lse), 1e-5, "row %d alt %d", i, j)
				}
			}
			last := outs[R-1]
			require.EqualValues(t, 2, last.Nonfinite, "the raw row's non-finite values, processing or not")
			require.EqualValues(t, 17, last.FirstBad)
			require.True(t, math.IsNaN(last.BadValue))
		})
	}
}

// BenchmarkLogitsProcess times the device sampler's launches on the gpu
// preset's vocabulary (154880) at 1, 8 and 64 rows, greedy: the sampler
// alone (no processing launch, as an eager step without processed rows),
// with glmf_logits_process on rows without processing (its launch only:
// what a captured graph always runs), and with every row processed by 64
// edits, a mask allowing half the vocabulary, or both. Device µs per step
// from CUDA events around a captured graph of the launches.
//
//	go test -run - -bench LogitsProcess ./kernels/cuda
func BenchmarkLogitsProcess(b *testing.B) {
	d := openDevice(b)
	if d.Emulated {
		b.Skip("the emulator's timings mean nothing")
	}
	const reps, V, chunk, threads = 20, 154880, 2048, 256
	nc := int64((V + chunk - 1) / chunk)
	r := rand.New(rand.NewPCG(5, 6))
	for _, R := range []int{1, 8, 64} {
		base := procRow{p: sample.Greedy()}
		mask := make([]uint32, sample.AllowWords(V))
		for i := range mask {
			mask[i] = r.Uint32()
		}
		var edits []sample.Edit
		for t := 0; t < V && len(edits) < 64; t += V / 64 {
			edits = append(edits, sample.Edit{Token: int32(t), Penalty: 1.2, Add: -0.5})
		}
		for _, c := range []struct {
			name   string
			launch bool
			edits  []sample.Edit
			allow  []uint32
		}{{"sampler", false, nil, nil}, {"unprocessed", true, nil, nil}, {"edits64", true, edits, nil}, {"mask", true, nil, mask}, {"mask+edits64", true, edits, mask}} {
			rows := make([]procRow, R)
			for i := range rows {
				rows[i] = base
				rows[i].logits, rows[i].edits, rows[i].allow = randn(r, V, 2), c.edits, c.allow
			}
			L, S := procUpload(b, d, rows)
			Pr, P := poisoned[float32](b, d, R*V), poisoned[kc.SamplePart](b, d, R*int(nc))
			O := poisoned[kc.SampleOut](b, d, R)
			pa := kc.LogitsProcessArgs{Logits: L.p, Vocab: V, Rows: int64(R), Chunk: chunk, Nchunks: nc, Specs: S.p, Out: Pr.p}
			sa := kc.SamplePartArgs{Logits: L.p, Vocab: V, Rows: int64(R), Chunk: chunk, Nchunks: nc, Specs: S.p, Parts: P.p, Processed: Pr.p}
			a := kc.SampleArgs{Logits: L.p, Vocab: V, Rows: int64(R), Specs: S.p, Out: O.p, Parts: P.p, Nchunks: nc, Processed: Pr.p}
			grid := kc.Dim3{X: uint32(nc), Y: uint32(R)}
			b.Run(fmt.Sprintf("rows%d/%s", R, c.name), func(b *testing.B) {
				us := deviceMicros(b, d, reps, true, func() error {
					if c.launch {
						if err := kc.LaunchLogitsProcess(d, grid, kc.Dim3{X: threads}, 0, &pa); err != nil {
							return err
						}
					}
					if err := kc.LaunchSamplePart(d, grid, kc.Dim3{X: threads}, 0, &sa); err != nil {
						return err
					}
					return kc.LaunchSample(d, kc.Dim3{X: uint32(R)}, kc.Dim3{X: threads}, 0, &a)
				})
				b.ReportMetric(us, "us/step")
			})
		}
	}
}
