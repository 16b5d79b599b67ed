package cuda

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
)

// Tensor-parallel collectives are not bound on CUDA yet (NCCL through
// purego, or ranks sharing one device: docs/tensor-parallel.md); a sharded
// graph is refused at compile, naming the op.
func init() {
	bind(ir.OpAllReduce, bindCollective)
	bind(ir.OpAllGatherCols, bindCollective)
}

func bindCollective(_ *Program, n *ir.Node) (*kstep, error) {
	return nil, fmt.Errorf("%s: tensor parallelism (parallel.tp_size %d) is not implemented on the cuda backend yet (no NCCL communicator)", n.Op, ir.AttrRanks.Get(n))
}
