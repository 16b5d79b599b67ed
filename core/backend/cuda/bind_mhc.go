package cuda

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// mHC ops: pre, post and the fused post+pre (declined above its token cap
// to the unfused kernels, which compute the same bits).
func init() {
	bind(ir.OpMHCPre, bindMHCPre)
	bind(ir.OpMHCPost, bindMHCPost)
	bind(ir.OpMHCPostPre, bindMHCPostPre)
}

// mhcMaxStreams is MHC_MAX_H of mhc.cu.
const mhcMaxStreams = 16

// The pre's first stage (glmf_mhc_pre, glmf_mhc_post_pre) runs a block per
// chunk of the flattened streams and MHC_TT tokens; its partial sums go to
// a scratch buffer of doubles [T][chunks][mix+1] that glmf_mhc_mix (two
// blocks per token, kc.MHCMixGrid) reduces.
const (
	mhcChunkValues = 256 // MHC_CK
	mhcTileTokens  = 8   // MHC_TT
)

// mhcChunks is the number of chunks of a token's H·D stream values.
func mhcChunks(H, D int) int {
	dc := mhcChunkValues / H
	return (D + dc - 1) / dc
}

// mhcPartBytes is the size of the first stage's scratch for T tokens.
func mhcPartBytes(T, H, D int) int64 {
	return 8 * int64(T) * int64(mhcChunks(H, D)) * int64((2+H)*H+1)
}

// mhcTokRows is MHC_RS: the mixing rows a block of the few-token variants
// (glmf_mhc_pre_tok, glmf_mhc_post_pre_tok) sums.
const mhcTokRows = 8

// mhcStage1 returns the variant and grid of the pre's first stage
// (glmf_mhc_pre or glmf_mhc_post_pre: kc.MHCPreKernel,
// kc.MHCPostPreKernel): below MHC_TT tokens (tok) their few-token variant,
// a block per MHC_TT chunks, row group and token, which computes the same
// bits with all its lanes busy.
func mhcStage1(T, H, D int) (tok bool, grid kc.Dim3) {
	if T < mhcTileTokens {
		mix := (2 + H) * H
		return true, kc.Dim3{X: uint32((mhcChunks(H, D) + mhcTileTokens - 1) / mhcTileTokens), Y: uint32((mix + mhcTokRows - 1) / mhcTokRows), Z: uint32(T)}
	}
	return false, kc.Dim3{X: uint32(mhcChunks(H, D)), Y: uint32((T + mhcTileTokens - 1) / mhcTileTokens)}
}

// launchPre runs the pre on streams X: the split-K projection, then the
// per-token mixing, collapse and optional RMSNorm (normW.ptr 0: none).
func launchPre(rc *runCtx, prm kc.MHCParams, X, part, h, post, comb kc.DevicePtr, normW devTensor, normEps float64) error {
	H, D := int(prm.H), int(prm.D)
	if rc.T == 0 {
		return nil
	}
	pa := kc.MHCPreArgs{P: prm, X: X, Part: part, T: int64(rc.T)}
	tok, grid := mhcStage1(rc.T, H, D)
	if err := kc.MHCPreKernel(tok).Launch(rc.dev, grid, block256, 0, &pa); err != nil {
		return err
	}
	return launchMix(rc, prm, X, part, h, post, comb, normW, normEps)
}

func launchMix(rc *runCtx, prm kc.MHCParams, X, part, h, post, comb kc.DevicePtr, normW devTensor, normEps float64) error {
	ma := kc.MHCMixArgs{P: prm, X: X, Part: part, H: h, Post: post, Comb: comb, NormW: normW.ptr, NormBf16: normW.flag(), NormEps: normEps, T: int64(rc.T)}
	return kc.LaunchMHCMix(rc.dev, kc.MHCMixGrid(rc.T), block256, 0, &ma)
}

func mhcParams(p *Program, n *ir.Node, x, fn, base, scale *ir.Value) (kc.MHCParams, error) {
	H, D := x.Shape[1], x.Shape[2]
	if H > mhcMaxStreams {
		return kc.MHCParams{}, fmt.Errorf("hc_mult %d exceeds the %d streams the CUDA kernels hold", H, mhcMaxStreams)
	}
	F, err := p.w(fn)
	if err != nil {
		return kc.MHCParams{}, err
	}
	B, err := p.w(base)
	if err != nil {
		return kc.MHCParams{}, err
	}
	S, err := p.w(scale)
	if err != nil {
		return kc.MHCParams{}, err
	}
	return kc.MHCParams{Fn: F.ptr, FnBf16: F.flag(), Base: B.ptr, BaseBf16: B.flag(), Scale: S.ptr, ScaleBf16: S.flag(),
		H: int64(H), D: int64(D), Iters: int64(ir.AttrIters.Get(n)),
		NormEps: float64(float32(ir.AttrEps.Get(n))), HcEps: float64(float32(ir.AttrHCEps.Get(n)))}, nil
}

func bindMHCPre(p *Program, n *ir.Node) (*kstep, error) {
	in, outs := n.Inputs, n.Outputs
	prm, err := mhcParams(p, n, in[0], in[1], in[2], in[3])
	if err != nil {
		return nil, err
	}
	H, D := int(prm.H), int(prm.D)
	return &kstep{
		temps: func(rc *runCtx) []int64 { return []int64{mhcPartBytes(rc.T, H, D)} },
		run: func(rc *runCtx) error {
			return launchPre(rc, prm, rc.ptr(in[0]), rc.temps[0], rc.ptr(outs[0]), rc.ptr(outs[1]), rc.ptr(outs[2]), devTensor{}, 0)
		}}, nil
}

func launchPost(rc *runCtx, o, R, post, comb, out kc.DevicePtr, H, D int) error {
	a := kc.MHCPostArgs{O: o, R: R, Post: post, Comb: comb, Out: out, T: int64(rc.T), H: int64(H), D: int64(D)}
	return kc.LaunchMHCPost(rc.dev, blocks(int64(rc.T*H*D)), block256, 0, &a)
}

func bindMHCPost(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	H, D := in[1].Shape[1], in[1].Shape[2]
	return &kstep{run: func(rc *runCtx) error {
		return launchPost(rc, rc.ptr(in[0]), rc.ptr(in[1]), rc.ptr(in[2]), rc.ptr(in[3]), rc.ptr(out), H, D)
	}}, nil
}

func bindMHCPostPre(p *Program, n *ir.Node) (*kstep, error) {
	in, outs := n.Inputs, n.Outputs
	prm, err := mhcParams(p, n, in[1], in[4], in[5], in[6])
	if err != nil {
		return nil, err
	}
	H, D := int(prm.H), int(prm.D)
	var normW devTensor
	if len(in) == 8 {
		if normW, err = p.w(in[7]); err != nil {
			return nil, err
		}
	}
	normEps := float64(float32(ir.AttrNormEps.Get(n)))
	maxTokens := ir.AttrMaxTokens.Get(n)
	return &kstep{
		temps: func(rc *runCtx) []int64 { return []int64{mhcPartBytes(rc.T, H, D)} },
		run: func(rc *runCtx) error {
			o, R, post, comb := rc.ptr(in[0]), rc.ptr(in[1]), rc.ptr(in[2]), rc.ptr(in[3])
			X, h, post2, comb2 := rc.ptr(outs[0]), rc.ptr(outs[1]), rc.ptr(outs[2]), rc.ptr(outs[3])
			part := rc.temps[0]
			if rc.T == 0 {
				return nil
			}
			if maxTokens == 0 || rc.T <= maxTokens {
				// two launches: post + the projection, then the mixing,
				// collapse and norm (unfused: post, pre's two, rmsnorm)
				rc.p.fusedMHC.Add(1)
				args := kc.MHCPostPreArgs{P: prm, O: o, R: R, Post: post, Comb: comb, Out: X, Part: part, T: int64(rc.T)}
				tok, grid := mhcStage1(rc.T, H, D)
				if err := kc.MHCPostPreKernel(tok).Launch(rc.dev, grid, block256, 0, &args); err != nil {
					return err
				}
				return launchMix(rc, prm, X, part, h, post2, comb2, normW, normEps)
			}
			// declined: the unfused sequence, same kernels' arithmetic
			if err := launchPost(rc, o, R, post, comb, X, H, D); err != nil {
				return err
			}
			if err := launchPre(rc, prm, X, part, h, post2, comb2, devTensor{}, 0); err != nil {
				return err
			}
			if normW.ptr == 0 {
				return nil
			}
			na := kc.NormArgs{X: h, W: normW.ptr, WBf16: normW.flag(), Y: h, Rows: int64(rc.T), D: int64(D), Eps: normEps}
			return kc.LaunchRmsnorm(rc.dev, kc.Dim3{X: uint32(rc.T)}, block256, 0, &na)
		}}, nil
}
