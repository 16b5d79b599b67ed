package speculative

import (
	"encoding/binary"
	"hash/fnv"

	"github.com/glmflash/glmflash/core/sample"
)

// Simulated acceptance (speculative.simulate_acceptance, SGLang's
// SGLANG_SIMULATE_ACC_LEN): a verify span accepts its drafts by a seeded
// Bernoulli chain of a per-draft rate, whatever the target says, so that
// the acceptance the serving path sees is pinned apart from the weights.
// The decision for a sequence's generated-token index i is a hash of the
// sequence's key (SimulationKey: its seed and prompt) and i, so it is the
// same whatever the batching, and each index is decided once (a rejected
// index is the target's token, the next span starts after it). It changes
// outputs: the accepted drafts are the drafter's tokens, not the target's.

// SimulationKey is a sequence's key for SimulatedAccepts: a hash of its
// sampling seed and its prompt.
func SimulationKey(seed uint64, prompt []int32) uint64 {
	f := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	f.Write(b[:])
	for _, t := range prompt {
		binary.LittleEndian.PutUint32(b[:4], uint32(t))
		f.Write(b[:4])
	}
	return f.Sum64()
}

// SimulatedAccepts is how many of n drafts a span accepts under simulated
// acceptance at rate: the drafts for generated-token indexes i0, i0+1, …
// are accepted while each index's draw is below rate.
func SimulatedAccepts(rate float64, key uint64, i0, n int) int {
	a := 0
	for a < n && unit(key, i0+a) < rate {
		a++
	}
	return a
}

// unit is a uniform draw in [0, 1) from (key, i): splitmix64's finalizer.
func unit(key uint64, i int) float64 {
	x := key ^ uint64(i)*0xbf58476d1ce4e5b9 ^ 0x73696d61636365 // "simacce"
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

// SimulatedNext is the target's token after a span whose first accepted
// drafts were accepted by simulation: at the first rejected draft (accepted
// < len(drafts)) the normal rejection's token, drawn from norm(max(0,
// p − q)) at that row (greedy: the row's argmax); after every draft the
// bonus token, drawn from the last row's p (greedy: its argmax). row, q, p
// and draw are Accept's.
func SimulatedNext(row func(j int) []float32, drafts []int32, q []Dist, p sample.Params, accepted int, draw func() float64) int32 {
	if p.Temperature == 0 {
		return int32(sample.Argmax(row(accepted)))
	}
	if accepted == len(drafts) {
		return int32(sample.Pick(row(accepted), p, draw()))
	}
	ids, probs := sample.Dist(row(accepted), p)
	return residual(ids, probs, q, accepted, drafts[accepted], draw())
}
