package pass

import "github.com/glmflash/glmflash/core/ir"

// GraphKind says what a graph computes for speculative decoding.
type GraphKind string

// Graph kinds.
const (
	// PlainGraph: the target's prefill, decode, extend or mixed batches.
	PlainGraph GraphKind = "plain"
	// VerifyGraph: the target's continuous batch holding verify spans
	// (mode verify): per-position KDA states are kept for rollback, and
	// the positions it starts from came from the previous step's
	// acceptance, so the host cannot prepare it ahead.
	VerifyGraph GraphKind = "verify"
	// DraftGraph: the MTP (NextN) layer's graph, in any mode: the draft
	// extend over committed tokens (mode extend after a prefill chunk,
	// mode verify after acceptance: its lengths are accept lengths) and
	// the draft steps (mode decode, which may reuse step 0's indexer
	// selection); and a DFlash drafter's block draft forward (ir.Graph.DFlash:
	// Qwen3 decoder layers over the context rows and the block, no KDA,
	// mHC, DSA or MoE).
	DraftGraph GraphKind = "draft"
)

// KindOf classifies a graph by the properties the graph builder sets.
func KindOf(g *ir.Graph) GraphKind {
	if _, mtp := g.MTPLayer(); mtp || g.DFlash() {
		return DraftGraph
	}
	if g.Mode() == ir.ModeVerify {
		return VerifyGraph
	}
	return PlainGraph
}

// LengthsFromAcceptance reports whether a graph's batch lengths or starting
// positions are the output of the previous step's acceptance (a verify
// graph, or a draft extend after a verify step): known to the host only
// after that step's results, never ahead of it.
func LengthsFromAcceptance(g *ir.Graph) bool {
	return g.Mode() == ir.ModeVerify
}
