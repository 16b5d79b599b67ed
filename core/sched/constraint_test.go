package sched

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
)

// script is a Constraint that allows one token at a time, from want.
type script struct {
	want      []int32
	i         int
	remaining []int // what each Allow was told
	min       int
	acceptErr error
}

func (c *script) Allow(remaining int) []uint32 {
	c.remaining = append(c.remaining, remaining)
	mask := make([]uint32, sample.AllowWords(fakeVocab))
	t := c.want[c.i]
	mask[t/32] |= 1 << (t % 32)
	return mask
}

func (c *script) Accept(tok int32) (bool, error) {
	if c.acceptErr != nil {
		return false, c.acceptErr
	}
	if tok != c.want[c.i] {
		return false, errors.New("not allowed")
	}
	c.i++
	return c.i == len(c.want), nil
}

func (c *script) MinTokens() int { return c.min }

// pickAllowed makes the fake model pick, in each row, the lowest token its
// spec's mask allows (else 7).
func pickAllowed(m *fakeModel) {
	m.pick = func(row int) int32 {
		m.mu.Lock()
		b := m.runs[len(m.runs)-1]
		m.mu.Unlock()
		if a := b.Sample[row].Allow; a != nil {
			for t := range int32(fakeVocab) {
				if sample.Allowed(a, t) {
					return t
				}
			}
		}
		return 7
	}
}

func runSteps(t *testing.T, rt *Scheduler, n int) {
	t.Helper()
	for range n {
		admit(t, rt)
		var s step
		take(rt, &s, nil)
		rt.executeStep(&s, noPrepareNext)
		rt.collectStep(&s)
	}
}

// A constrained request's rows carry its mask (Allow told the tokens left),
// each pick is accepted, and the constraint's done ends it with
// FinishStop; it never speculates, beside a request that does.
func TestConstraintMasksRowsAndEndsTheRequest(t *testing.T) {
	m := newFakeModel(2)
	pickAllowed(m)
	d := &fakeDrafter{max: 2, drafts: func(speculative.SeqID) []int32 { return nil }}
	rt := idle(t, m, Config{}, Options{Drafter: d})
	c := &script{want: []int32{10, 11, 12}}
	r := submit(t, rt, Request{ID: "c", Prompt: []int32{1, 2}, MaxTokens: 9, Sampling: sample.Greedy(), Constraint: c})
	free := submit(t, rt, Request{ID: "free", Prompt: []int32{3}, MaxTokens: 1, Sampling: sample.Greedy()})
	runSteps(t, rt, 3)
	require.Equal(t, []speculative.SeqID{"free"}, d.started, "the constrained request does not speculate")
	require.Equal(t, []int32{10, 11, 12}, ids(r.pending))
	require.NotNil(t, r.final)
	require.Equal(t, FinishStop, r.final.Reason)
	require.Equal(t, []int{9, 8, 7}, c.remaining)
	require.Equal(t, []int32{7}, ids(free.pending), "an unconstrained row has no mask")
	for _, b := range m.runs {
		for _, sp := range b.Sample {
			if sp.Allow != nil {
				require.Len(t, sp.Allow, sample.AllowWords(fakeVocab))
			}
		}
	}
}

// A token the constraint refuses ends the request with FinishError and is
// not delivered.
func TestConstraintRefusalFailsTheRequest(t *testing.T) {
	m := newFakeModel(1)
	rt := idle(t, m, Config{}, Options{})
	r := submit(t, rt, Request{Prompt: []int32{1}, MaxTokens: 5, Sampling: sample.Greedy(), Constraint: &script{want: []int32{10}, acceptErr: errors.New("grammar: no")}})
	runSteps(t, rt, 1)
	require.Empty(t, r.pending)
	require.Equal(t, FinishError, r.final.Reason)
	require.Contains(t, r.final.Message, "constraint: grammar: no")
}

func TestConstraintValidation(t *testing.T) {
	m := newFakeModel(1)
	rt := idle(t, m, Config{}, Options{})
	err := rt.Validate(&Request{Prompt: []int32{1}, MaxTokens: 4, Sampling: sample.Greedy(), Constraint: &script{want: []int32{1}, min: 5}})
	var inv *InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "max_tokens", inv.Field)
	require.Contains(t, inv.Msg, "at least 5 tokens")
	require.NoError(t, rt.Validate(&Request{Prompt: []int32{1}, MaxTokens: 5, Sampling: sample.Greedy(), Constraint: &script{want: []int32{1}, min: 5}}))
	err = rt.Validate(&Request{Prompt: []int32{1}, MaxTokens: 5, MinTokens: 2, Sampling: sample.Greedy(), Constraint: &script{want: []int32{1}}})
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "min_tokens", inv.Field)
	err = rt.Validate(&Request{Prompt: []int32{1}, MaxTokens: 5, Score: true, Constraint: &script{want: []int32{1}}})
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "constraint", inv.Field)
}
