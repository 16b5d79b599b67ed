// Package hostlen is the host-length-reuse pass: KDA and DSA nodes read the
// scheduler's host-side batch lengths instead of the per-sequence lengths
// the executor materializes (seq_lengths), so the host side of a batch
// (validation, metadata) no longer depends on executor output and can be
// prepared while the previous batch computes. The executor validates the
// host lengths against the token count on every use and fails loudly if
// they disagree.
package hostlen

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
)

// Name is the pass's YAML name.
const Name = "host-length-reuse"

// Description is the pass as the registry, the report and `glmflash passes list`
// know it.
var Description = pass.Description{Name: Name, Version: "1.0.0",
	Summary: "KDA/DSA nodes read host-side batch lengths instead of executor-produced ones",
	Verify:  "eligible: a verify batch starts from positions the previous step's acceptance produced, and the scheduler builds it after that acceptance (it never prepares a verify step ahead), so its host lengths are exact; the block verify then needs no length read-back and runs from CUDA graphs",
	Draft:   "eligible for draft steps (mode decode: one token per sequence at positions the drafter knows), for the draft extend after a prefill chunk (mode extend) and after a verify step (mode verify: the drafter builds it after the acceptance, so the host knows its lengths); a DFlash draft graph reads no executor lengths (dflash_attn takes the host batch): no sites"}

func init() { pass.Register(Description, func() pass.Pass { return &Pass{} }) }

// Pass implements pass.Pass.
type Pass struct{}

// Stats are the pass's statistics. On a device backend every node that
// reads the executor's lengths costs one device-to-host copy and host sync
// per step (the CUDA backend counts them as length syncs): the first and
// the last statistic are those syncs, removed and left.
type Stats struct {
	Rewired int `stat:"readers_rewired" doc:"nodes now reading the host lengths: device length read-backs (host syncs) removed per step"`
	Removed int `stat:"nodes_removed" doc:"nodes left dead: the executor's seq_lengths"`
	Left    int `stat:"length_syncs_left" doc:"nodes still reading the executor's lengths: device length read-backs (host syncs) left per step"`
}

// Eligible implements pass.Pass: one site per node whose lengths source
// (the ReadsLengths trait) is the executor's seq_lengths.
func (*Pass) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	var sites []pass.Site
	batch := g.Input(ir.InputBatch)
	for _, n := range g.Nodes {
		if !readsExecutorLengths(n) {
			continue
		}
		where := fmt.Sprintf("layer %d %s", n.Layer, n.Op)
		if n.Layer < 0 {
			where = n.Op
		}
		switch {
		case batch == nil || !env.HostLengths:
			sites = append(sites, pass.Skip(where, n.Layer, "host batch metadata is absent"))
		case ir.AttrLengthsFrom.Get(n) == ir.LengthsAccept:
			sites = append(sites, pass.Skip(where, n.Layer, "lengths are produced by the computation (speculative accept lengths)"))
		default:
			sites = append(sites, pass.Site{Where: where, Layer: n.Layer, OK: true, Nodes: []*ir.Node{n}, Data: batch})
		}
	}
	return sites
}

// readsExecutorLengths says whether n's lengths (the ReadsLengths trait)
// come from the executor's seq_lengths.
func readsExecutorLengths(n *ir.Node) bool {
	return n.Def().ReadsLengths && n.Inputs[0].Producer != nil && n.Inputs[0].Producer.Op == ir.OpSeqLengths
}

// Apply implements pass.Pass.
func (*Pass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	for _, s := range sites {
		n := s.Nodes[0]
		n.Inputs[0] = s.Data.(*ir.Value)
		ir.AttrLengths.Set(n, ir.LengthsHost)
	}
	removed := g.RemoveDead()
	left := 0
	for _, n := range g.Nodes {
		if readsExecutorLengths(n) {
			left++
		}
	}
	return pass.Result{Fired: len(sites), Stats: pass.Counters(&Stats{Rewired: len(sites), Removed: removed, Left: left}),
		Notes: []string{fmt.Sprintf("length syncs per step on a device backend: %d before, %d after", len(sites)+left, left)}}, nil
}
