package cuda

import (
	"unsafe"

	"github.com/glmflash/glmflash/core/backend"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// packMeta packs the batch's host metadata (tokens, hidden rows, context
// rows and a DFlash draft batch's context counts, the sequences' spans and
// every row's sequence and position, checkpoints, saved selections,
// span-logits rows, sampling specs and the processed rows' edits and allow
// masks, after everything else) for its one upload,
// grows the device buffer to it and points rc at its sections. It returns
// the packed bytes (uploaded at p.meta with the step's first device work)
// and the sampling specs' address (0: the batch does not sample).
func (p *Program) packMeta(rc *runCtx, ckpt, share []int) (*metaBuilder, kc.DevicePtr, error) {
	pr := rc.pr
	// The builder reuses the program's buffer of the last step (execute
	// holds the device lock, and an upload from pageable memory has copied
	// it out when Upload returns): a step's processed rows' masks are
	// megabytes, regrown and collected every step otherwise.
	mb := &metaBuilder{buf: p.metaHost[:0]}
	defer func() { p.metaHost = mb.buf[:0] }()
	rowSeq, rowPos := make([]int32, rc.T), make([]int32, rc.T)
	slot, pos0, nn, row0, last := make([]int32, rc.S), make([]int32, rc.S), make([]int32, rc.S), make([]int32, rc.S), make([]int32, rc.S)
	for i, s := range pr.Spans {
		slot[i], pos0[i], nn[i], row0[i], last[i] = int32(s.Slot), int32(s.Pos0), int32(s.N), int32(s.Row0), int32(s.Row0+s.N-1)
		for j := 0; j < s.N; j++ {
			rowSeq[s.Row0+j], rowPos[s.Row0+j] = int32(i), int32(s.Pos0+j)
		}
	}
	oTok := mb.i32(pr.Tokens)
	var oHidden int64 = -1
	if pr.Hidden != nil {
		oHidden = mb.f32(pr.Hidden)
	}
	var oContext int64 = -1
	if pr.Context != nil {
		oContext = mb.f32(pr.Context)
	}
	var oDC, oDCRow0 int64 = -1, -1
	if rc.draft != nil { // a DFlash draft batch: per sequence its context rows and the first
		dc, dr := make([]int32, rc.S), make([]int32, rc.S)
		for i, s := range pr.Spans {
			dc[i], dr[i] = int32(s.C), int32(s.CRow0)
		}
		oDC, oDCRow0 = mb.i32(dc), mb.i32(dr)
	}
	oSlot, oPos0, oN, oRow0 := mb.i32(slot), mb.i32(pos0), mb.i32(nn), mb.i32(row0)
	oRowSeq, oRowPos, oLast := mb.i32(rowSeq), mb.i32(rowPos), mb.i32(last)
	ck, sp := make([]int32, rc.S), make([]int32, rc.S)
	for i := range ck {
		ck[i], sp[i] = int32(ckpt[i]), int32(share[i])
	}
	oCkpt, oShare, oSpanRows := mb.i32(ck), mb.i32(sp), mb.i32(pr.SpanRowIndex())
	var oSpec int64 = -1
	var specs []kc.SampleSpec
	var procs []procOffsets
	if pr.Sample != nil {
		specs = make([]kc.SampleSpec, len(pr.Sample))
		for i, s := range pr.Sample {
			specs[i] = kc.SampleSpec{Temperature: s.Params.Temperature, TopP: s.Params.TopP, MinP: s.Params.MinP, U: s.U, TopK: int64(s.Params.TopK), NTop: int64(s.TopLogprobs)}
		}
		oSpec = mb.raw(unsafe.Pointer(unsafe.SliceData(specs)), int64(len(specs))*int64(unsafe.Sizeof(specs[0])))
		procs = packProcessing(mb, pr.Sample)
	}
	if err := p.ensure(&p.meta, &p.metaSize, int64(len(mb.buf))); err != nil {
		return nil, 0, err
	}
	at := func(off int64) kc.DevicePtr { return p.meta + kc.DevicePtr(off) }
	if len(procs) > 0 { // the processed rows' specs point at their edits and masks
		for _, o := range procs {
			sp := &specs[o.row]
			if o.edits >= 0 {
				sp.Edits, sp.NEdits = at(o.edits), o.nEdits
			}
			if o.allow >= 0 {
				sp.Allow = at(o.allow)
			}
		}
		n := int64(len(specs)) * int64(unsafe.Sizeof(specs[0]))
		copy(mb.buf[oSpec:oSpec+n], unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(specs))), n))
	}
	rc.toks = at(oTok)
	if oHidden >= 0 {
		rc.hidden = at(oHidden)
	}
	if oContext >= 0 {
		rc.context = at(oContext)
	}
	if oDC >= 0 { // L_s is the span's cached positions: the draft slot's length
		rc.dmeta = kc.DFlashMeta{Slot: at(oSlot), L: at(oPos0), C: at(oDC), Crow0: at(oDCRow0), S: int64(rc.S)}
	}
	rc.ckpt, rc.sharePos, rc.spanRows = at(oCkpt), at(oShare), at(oSpanRows)
	rc.meta = kc.BatchMeta{SeqSlot: at(oSlot), SeqPos0: at(oPos0), SeqN: at(oN), SeqRow0: at(oRow0), RowSeq: at(oRowSeq), RowPos: at(oRowPos), LastRow: at(oLast), S: int64(rc.S), T: int64(rc.T)}
	var specsAt kc.DevicePtr
	if oSpec >= 0 {
		specsAt = at(oSpec)
	}
	return mb, specsAt, nil
}

// procOffsets is where a processed row's edits and allow mask lie in the
// metadata (−1: none).
type procOffsets struct {
	row           int
	edits, nEdits int64
	allow         int64
}

// packProcessing packs the processed rows' edits (as kc.LogitEdit) and
// allow masks after the metadata's other sections, and says where each
// row's lie; rows without processing add nothing. (Their addresses are set
// in the specs once the buffer's is known: the specs are data, uploaded
// every step, so a captured graph reads whatever this step packed.)
func packProcessing(mb *metaBuilder, specs []backend.SampleSpec) []procOffsets {
	var procs []procOffsets
	nEdits, allowWords := 0, 0
	for i := range specs {
		nEdits += len(specs[i].Edits)
		allowWords += len(specs[i].Allow)
	}
	if nEdits == 0 && allowWords == 0 {
		return nil // no processed row (a decode step's usual case)
	}
	mb.reserve(int64(nEdits)*int64(unsafe.Sizeof(kc.LogitEdit{})) + 4*int64(allowWords) + 32*int64(len(specs)))
	// Rows in the same constraint state share one cached mask (a grammar's
	// per-state mask): it is packed once.
	packed := map[*uint32]int64{}
	edits := make([]kc.LogitEdit, 0, nEdits)
	for i := range specs {
		s := &specs[i]
		if !s.Processed() {
			continue
		}
		o := procOffsets{row: i, edits: -1, allow: -1}
		if len(s.Edits) > 0 {
			o.nEdits = int64(len(s.Edits))
			first := len(edits)
			for _, e := range s.Edits {
				edits = append(edits, kc.LogitEdit{Token: int64(e.Token), Penalty: float64(e.Penalty), Add: float64(e.Add)})
			}
			part := edits[first:]
			o.edits = mb.raw(unsafe.Pointer(unsafe.SliceData(part)), int64(len(part))*int64(unsafe.Sizeof(part[0])))
		}
		if s.Allow != nil {
			k := unsafe.SliceData(s.Allow)
			off, ok := packed[k]
			if !ok { // (every mask has AllowWords(vocab) words: CheckProcessing)
				off = mb.u32(s.Allow)
				packed[k] = off
			}
			o.allow = off
		}
		procs = append(procs, o)
	}
	return procs
}

// metaBuilder packs the step's host metadata into one buffer (8-byte
// aligned sections).
type metaBuilder struct{ buf []byte }

// reserve grows the buffer's capacity by n bytes at once.
func (m *metaBuilder) reserve(n int64) {
	if free := int64(cap(m.buf) - len(m.buf)); free < n {
		m.buf = append(m.buf[:len(m.buf):len(m.buf)], make([]byte, n)...)[:len(m.buf)]
	}
}

func (m *metaBuilder) raw(p unsafe.Pointer, n int64) int64 {
	for len(m.buf)%16 != 0 {
		m.buf = append(m.buf, 0)
	}
	off := int64(len(m.buf))
	if n > 0 {
		m.buf = append(m.buf, unsafe.Slice((*byte)(p), n)...)
	}
	return off
}

func (m *metaBuilder) f32(v []float32) int64 {
	if len(v) == 0 {
		return m.raw(nil, 0)
	}
	return m.raw(unsafe.Pointer(unsafe.SliceData(v)), 4*int64(len(v)))
}

func (m *metaBuilder) u32(v []uint32) int64 {
	if len(v) == 0 {
		return m.raw(nil, 0)
	}
	return m.raw(unsafe.Pointer(unsafe.SliceData(v)), 4*int64(len(v)))
}

func (m *metaBuilder) i32(v []int32) int64 {
	if len(v) == 0 {
		return m.raw(nil, 0)
	}
	return m.raw(unsafe.Pointer(unsafe.SliceData(v)), 4*int64(len(v)))
}
