package sample

import (
	"fmt"

	"github.com/glmflash/glmflash/core/collective"
)

// ShardedArgmax is Argmax over vocabulary-parallel logits without gathering
// them: on every rank of c, logits holds rows rows of the rank's
// vocabulary block, ids [rank·V, (rank+1)·V) (the lm_head shard of a
// tensor-parallel graph before its all_gather_cols). Each rank reduces its
// block to (max, argmax) per row, the ranks all-gather those pairs (2 values
// per row per rank instead of V) and each picks the largest value, the
// lowest id among equals: Argmax of the whole row, the same token on every
// rank. out gets one vocabulary id per row. Every rank must call it with
// the same rows and V.
func ShardedArgmax(c collective.Communicator, logits []float32, rows, V int, out []int) error {
	n := c.Size()
	switch {
	case rows < 0 || V < 1 || len(logits) < rows*V || len(out) < rows:
		return fmt.Errorf("sample: sharded argmax of %d rows × %d ids over %d logits into %d ids", rows, V, len(logits), len(out))
	case n*V > 1<<24: // ids travel as float32, exact below 2^24
		return fmt.Errorf("sample: sharded argmax over a vocabulary of %d ids (at most %d)", n*V, 1<<24)
	}
	local := make([]float32, 2*rows)
	base := c.Rank() * V
	for r := range rows {
		i := Argmax(logits[r*V : (r+1)*V])
		local[2*r], local[2*r+1] = logits[r*V+i], float32(base+i)
	}
	all := make([]float32, n*2*rows)
	if err := c.AllGather(all, local); err != nil {
		return err
	}
	for r := range rows {
		best, id := all[2*r], all[2*r+1]
		for k := 1; k < n; k++ { // ranks in id order: strict > keeps the lowest id
			if v := all[k*2*rows+2*r]; v > best {
				best, id = v, all[k*2*rows+2*r+1]
			}
		}
		out[r] = int(id)
	}
	return nil
}
