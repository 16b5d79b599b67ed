package cuda

import (
	"fmt"
	"unsafe"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/sample"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// sampleArgs prepares the device sampler's launches (glmf_logits_process,
// glmf_sample_part, glmf_sample): outputs, the chunks' scratch and, when
// some row samples (or the launch is captured, when any later step may),
// the per-row mass scratch; when some row's logits are processed (or the
// launch is captured, when any later step's may be), the processed rows'
// buffer, which the sampler reads those rows from. glmf_logits_process is
// launched in every case (its blocks return at once for rows without
// processing, and without a processed row it writes nothing), so eager
// steps run the kernels a replay runs. The layout depends only on the rows
// and on graphed, so a captured graph's addresses stay valid for every
// step of its shape (growing p.out drops the graphs).
func (p *Program) sampleArgs(rc *runCtx, specs kc.DevicePtr, rows int, graphed bool) (*sampleLaunch, error) {
	V := int64(p.plan.Vocab)
	outBytes := int64(rows) * int64(unsafe.Sizeof(kc.SampleOut{}))
	chunk, nchunks := sampleChunks(V)
	partBytes := int64(rows) * nchunks * int64(unsafe.Sizeof(kc.SamplePart{}))
	procBytes := roundUp(4 * int64(rows) * V)
	need := roundUp(outBytes) + roundUp(partBytes)
	anyTemp, anyProc := graphed, graphed
	for i := range rc.pr.Sample {
		s := &rc.pr.Sample[i]
		anyTemp = anyTemp || s.Params.Temperature > 0
		anyProc = anyProc || s.Processed()
	}
	if anyProc {
		need += procBytes
	}
	if anyTemp {
		need += 8 * int64(rows) * V
	}
	if err := p.ensure(&p.out, &p.outSize, need); err != nil {
		return nil, err
	}
	parts := p.out + kc.DevicePtr(roundUp(outBytes))
	next := parts + kc.DevicePtr(roundUp(partBytes))
	a := &kc.SampleArgs{Vocab: V, Rows: int64(rows), Specs: specs, Out: p.out, Parts: parts, Nchunks: nchunks}
	part := &kc.SamplePartArgs{Vocab: V, Rows: int64(rows), Chunk: chunk, Nchunks: nchunks, Specs: specs, Parts: parts}
	proc := &kc.LogitsProcessArgs{Vocab: V, Rows: int64(rows), Chunk: chunk, Nchunks: nchunks, Specs: specs}
	if anyProc {
		proc.Out, a.Processed, part.Processed = next, next, next
		next += kc.DevicePtr(procBytes)
	}
	if anyTemp {
		a.Mass = next
	}
	return &sampleLaunch{proc: proc, final: a, part: part}, nil
}

// sampleThreads is the block size of glmf_sample and glmf_sample_part;
// samplePartPer is SAMPLE_PART_PER of sample.cu.
const (
	sampleThreads = 256
	samplePartPer = 8
)

// sampleChunks splits a vocabulary of V logits into the chunks of
// glmf_sample_part (a block each, its logits in registers).
func sampleChunks(V int64) (chunk, n int64) {
	chunk = sampleThreads * samplePartPer
	return chunk, (V + chunk - 1) / chunk
}

// sampleLaunch is the sampler's launches: the processed rows
// (glmf_logits_process, a block per chunk of every row, returning at once
// for a row without processing), the chunks of every row
// (glmf_sample_part), then a block per row that combines them and picks.
type sampleLaunch struct {
	proc  *kc.LogitsProcessArgs
	final *kc.SampleArgs
	part  *kc.SamplePartArgs
}

func (l *sampleLaunch) launch(dev *kc.Device, logits kc.DevicePtr, rows int) error {
	l.proc.Logits, l.part.Logits, l.final.Logits = logits, logits, logits
	grid := kc.Dim3{X: uint32(l.part.Nchunks), Y: uint32(rows)}
	if err := kc.LaunchLogitsProcess(dev, grid, kc.Dim3{X: sampleThreads}, 0, l.proc); err != nil {
		return err
	}
	if err := kc.LaunchSamplePart(dev, grid, kc.Dim3{X: sampleThreads}, 0, l.part); err != nil {
		return err
	}
	return kc.LaunchSample(dev, kc.Dim3{X: uint32(rows)}, kc.Dim3{X: sampleThreads}, 0, l.final)
}

// readSamples copies the sampler's outputs back and turns them into picks.
func (p *Program) readSamples(rc *runCtx, rows int) ([]backend.Sample, error) {
	V := int64(p.plan.Vocab)
	outs := make([]kc.SampleOut, rows)
	if err := rc.dev.Download(unsafe.Pointer(unsafe.SliceData(outs)), p.out, int64(rows)*int64(unsafe.Sizeof(kc.SampleOut{}))); err != nil {
		return nil, err
	}
	res := make([]backend.Sample, rows)
	for i, o := range outs {
		if o.Nonfinite > 0 {
			res[i] = backend.Sample{Err: sample.NonFinite(int(o.Nonfinite), int(V), int(o.FirstBad), float32(o.BadValue))}
			continue
		}
		if o.Token < 0 || o.Token >= V {
			return nil, fmt.Errorf("cuda: the sampler picked token %d for row %d (vocabulary %d)", o.Token, i, V)
		}
		s := backend.Sample{Token: int32(o.Token), Logprob: float32(o.TokLogit - o.Lse)}
		for j := int64(0); j < o.NTop; j++ {
			s.Top = append(s.Top, sampleTop(o.TopId[j], o.TopLogit[j]-o.Lse))
		}
		res[i] = s
	}
	return res, nil
}
