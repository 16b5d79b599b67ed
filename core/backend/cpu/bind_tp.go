package cpu

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
)

// Tensor-parallel collectives, run through the backend's communicator
// (backend.Options.Comm): the ranks are goroutines of this process, each
// with its own backend and program.
func init() {
	bind(ir.OpAllReduce, bindAllReduce)
	bind(ir.OpAllGatherCols, bindAllGatherCols)
}

// checkComm refuses a collective whose group is not the backend's.
func checkComm(p *Program, n *ir.Node) error {
	c := p.opts.Comm
	if c == nil {
		return fmt.Errorf("%s: the graph is sharded over %d ranks but the backend has no communicator (one device)", n.Op, ir.AttrRanks.Get(n))
	}
	if c.Size() != ir.AttrRanks.Get(n) {
		return fmt.Errorf("%s: the graph is sharded over %d ranks but the backend's communicator has %d", n.Op, ir.AttrRanks.Get(n), c.Size())
	}
	return nil
}

func bindAllReduce(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	if err := checkComm(p, n); err != nil {
		return nil, err
	}
	in, out, c := n.Inputs[0], n.Outputs[0], p.opts.Comm
	return func(rc *runCtx) error {
		m := rc.size(in)
		y := rc.out(out)[:m]
		copy(y, rc.in(in)[:m])
		return c.AllReduceSum(y)
	}, nil
}

func bindAllGatherCols(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	if err := checkComm(p, n); err != nil {
		return nil, err
	}
	in, out, c := n.Inputs[0], n.Outputs[0], p.opts.Comm
	N, C := c.Size(), in.Shape[1]
	var blocks []float32 // rank-major [N][R][C], reused by every run
	return func(rc *runCtx) error {
		R := rc.rows(in)
		if cap(blocks) < N*R*C {
			blocks = make([]float32, N*R*C)
		}
		b := blocks[:N*R*C]
		if err := c.AllGather(b, rc.in(in)[:R*C]); err != nil {
			return err
		}
		y := rc.out(out)
		for r := range N {
			for i := range R {
				copy(y[i*N*C+r*C:i*N*C+(r+1)*C], b[r*R*C+i*C:r*R*C+(i+1)*C])
			}
		}
		return nil
	}, nil
}
