package sched

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/glmflash/glmflash/core/sample"
)

// DefaultMaxChoices is Config.MaxChoices when unset.
const DefaultMaxChoices = 16

// An n > 1 request is a group: its prompt, all but the last token, is
// prefilled once by the group's carrier (an internal request that is no
// choice and delivers nothing), then forked (Store.Copy) into one slot per
// choice; each choice runs the prompt's last token itself, so that its
// first token is drawn by its own sampler (seed + i) as an n = 1 request's
// would be, and goes on as an ordinary request with its own outbox, logits
// processing state (penalties over its own output), limits and finish. The group is admitted when a slot is free for each of its
// choices (the carrier's slot becomes the first choice's; the others are
// held, not running, until the fork), so a fork never waits for slots.
// Until the fork, a choice that ends (its own Abort, its submitter's
// context) gives its held slot back at once, and when every choice has
// ended the prefill stops; after it, choices end as any request does.
// Choices decode plainly: the drafter knows no forks.

// group is an n > 1 request in flight (guarded by Scheduler.mu).
type group struct {
	id        string
	owner     string
	carrier   *request   // runs the shared prefill; not in byID
	choices   []*request // choice i: id "<id>#<i>", seed Sampling.Seed+i
	forked    bool
	held      int // slots held for choices until the fork
	live      int // choices not yet finished
	stopWatch func() bool
}

// Group is the submitter's view of a request with N choices.
type Group struct {
	id      string
	choices []*Handle
}

// ID is the request's id (Abort with it ends every choice).
func (g *Group) ID() string { return g.id }

// Choices are the choices' handles, in order: choice i's id is
// ChoiceID(ID(), i) (the request's id itself for N ≤ 1), its seed the
// request's + i.
func (g *Group) Choices() []*Handle { return g.choices }

// ChoiceID is the id of choice i of a group id (Abort with it ends that
// choice alone).
func ChoiceID(id string, i int) string { return fmt.Sprintf("%s#%d", id, i) }

// validateN checks a request's N against the configuration.
func (rt *Scheduler) validateN(req *Request) error {
	switch n := req.N; {
	case n < 0:
		return invalid("n", "must be ≥ 1, got %d", n)
	case n <= 1:
		return nil
	case req.Score:
		return invalid("n", "a Score request has one result, got n = %d", n)
	case n > rt.cfg.MaxChoices:
		return invalid("n", "at most %d choices (runtime.max_choices), got %d", rt.cfg.MaxChoices, n)
	case n > rt.cfg.MaxRunning:
		return invalid("n", "at most %d choices: each runs in a cache slot of its own and at most %d requests run at once (runtime.max_running), got %d", rt.cfg.MaxRunning, rt.cfg.MaxRunning, n)
	}
	if _, ok := req.Constraint.(sample.Restarter); req.Constraint != nil && !ok {
		return invalid("n", "more than one choice needs a constraint that can restart (one per choice); this one cannot, got n = %d", req.N)
	}
	return nil
}

// SubmitGroup queues a request of req.N choices (N ≤ 1: one, Submit's
// request in a group of one). The choices are cancelled when ctx ends.
// Errors as Submit's; ErrDuplicateID also when a choice's id is in flight.
func (rt *Scheduler) SubmitGroup(ctx context.Context, req Request) (*Group, error) {
	if req.N <= 1 {
		h, err := rt.Submit(ctx, req)
		if err != nil {
			return nil, err
		}
		return &Group{id: h.ID(), choices: []*Handle{h}}, nil
	}
	if err := rt.Validate(&req); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if req.ID == "" {
		req.ID = NewID()
	}
	req.Prompt = slices.Clone(req.Prompt)
	req.StopIDs = slices.Clone(req.StopIDs)
	now := time.Now()
	g := &group{id: req.ID, owner: req.Owner, live: req.N}
	g.carrier = &request{
		Request: Request{ID: req.ID, Prompt: req.Prompt[:len(req.Prompt)-1], MaxTokens: req.MaxTokens, Owner: req.Owner, NoSpeculation: true},
		slot:    -1, arrived: now, notify: make(chan struct{}, 1), grp: g, carrier: true,
	}
	out := &Group{id: req.ID}
	for i := range req.N {
		c := req
		c.ID, c.N, c.NoSpeculation = ChoiceID(req.ID, i), 1, true
		c.Sampling.Seed = req.Sampling.Seed + uint64(i)
		if rs, ok := req.Constraint.(sample.Restarter); ok && i > 0 {
			c.Constraint = rs.Restart() // each choice follows its own output
		}
		r := &request{Request: c, sampler: sample.New(c.Sampling), proc: newProcs(&c, rt.endIDsIn(&c)), slot: -1, arrived: now, notify: make(chan struct{}, 1), grp: g, choice: i}
		if c.Stops != nil {
			r.stops = c.Stops()
		}
		g.choices = append(g.choices, r)
		out.choices = append(out.choices, &Handle{r: r})
	}
	rt.mu.Lock()
	switch {
	case rt.closing:
		rt.mu.Unlock()
		return nil, ErrClosed
	case rt.draining:
		rt.mu.Unlock()
		return nil, ErrDraining
	case rt.byID[g.id] != nil || rt.groups[g.id] != nil:
		rt.mu.Unlock()
		return nil, ErrDuplicateID
	}
	for _, r := range g.choices {
		if rt.byID[r.ID] != nil || rt.groups[r.ID] != nil {
			rt.mu.Unlock()
			return nil, ErrDuplicateID
		}
	}
	if rt.queueFullLocked() {
		rt.mu.Unlock()
		return nil, ErrQueueFull
	}
	rt.waiting = append(rt.waiting, g.carrier)
	rt.groups[g.id] = g
	for _, r := range g.choices {
		rt.byID[r.ID] = r
	}
	g.stopWatch = context.AfterFunc(ctx, func() { rt.killGroup(g, FinishCancelled, cancelled(ctx)) })
	rt.depthLocked()
	rt.mu.Unlock()
	signal(rt.wake)
	return out, nil
}

// killGroup ends every choice of g still in flight; it returns how many.
func (rt *Scheduler) killGroup(g *group, reason FinishReason, msg string) int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.killGroupLocked(g, reason, msg)
}

func (rt *Scheduler) killGroupLocked(g *group, reason FinishReason, msg string) int {
	n := 0
	for _, r := range g.choices {
		if rt.killLocked(r, reason, msg) {
			n++
		}
	}
	return n
}

// dropChoiceLocked lets a choice that ended before the fork go: its held
// slot is freed now (no step uses it), and when no choice is left the
// carrier stops (out of the queue, or its slot reaped at the next step
// boundary).
func (rt *Scheduler) dropChoiceLocked(g *group, r *request) {
	if r.slot >= 0 {
		rt.releaseLocked(r)
		g.held--
		rt.reserved--
	}
	for _, o := range g.choices {
		if !o.killed {
			return
		}
	}
	c := g.carrier
	c.killed = true
	if i := slices.Index(rt.waiting, c); i >= 0 {
		rt.waiting = slices.Delete(rt.waiting, i, i+1)
	}
}

// choiceEndedLocked counts a choice's final; after the last one the group
// is forgotten.
func (rt *Scheduler) choiceEndedLocked(g *group) {
	g.live--
	if g.live > 0 {
		return
	}
	delete(rt.groups, g.id)
	if g.stopWatch != nil {
		g.stopWatch()
	}
}

// releaseLocked gives r's slot back to the store.
func (rt *Scheduler) releaseLocked(r *request) {
	if err := rt.m.Store().Free(r.slot); err != nil {
		rt.log.Error().Err(err).Str("request_id", r.ID).Msg("freeing a cache slot")
	}
	r.slot = -1
}

// admitGroupLocked admits the group at the head of the queue when a slot
// is free for each of its live choices (within MaxRunning): the carrier
// takes one, to be the first live choice's, and the others are held for
// the rest. It reports false, admitting nothing, when they are not free.
func (rt *Scheduler) admitGroupLocked(g *group) bool {
	live := 0
	for _, r := range g.choices {
		if !r.killed {
			live++
		}
	}
	if live == 0 { // every choice ended while it waited (dropChoiceLocked dequeues it too)
		rt.waiting = slices.Delete(rt.waiting, 0, 1)
		return true
	}
	if len(rt.running)+rt.reserved+live > rt.cfg.MaxRunning || !rt.pagesAdmitLocked(len(g.carrier.Prompt)+1, live) {
		return false
	}
	slots := make([]int, 0, live)
	for range live {
		slot, err := rt.m.Store().Alloc()
		if err != nil { // held outside the runtime: give them back and wait
			for _, s := range slots {
				if err := rt.m.Store().Free(s); err != nil {
					rt.log.Error().Err(err).Str("request_id", g.id).Msg("freeing a cache slot")
				}
			}
			return false
		}
		slots = append(slots, slot)
	}
	rt.waiting = slices.Delete(rt.waiting, 0, 1)
	c := g.carrier
	c.slot, c.admitted = slots[0], time.Now()
	first := true
	for _, r := range g.choices {
		if r.killed {
			continue
		}
		if first { // runs in the carrier's slot
			first = false
			continue
		}
		slots = slots[1:]
		r.slot = slots[0]
		g.held++
		rt.reserved++
	}
	if len(c.Prompt) == 0 { // a one-token prompt: nothing to share
		rt.forkLocked(g)
	} else {
		rt.running = append(rt.running, c)
	}
	rt.depthLocked()
	return true
}

// forkLocked starts the group's choices once the carrier's prefill is done
// (after the step that completed it, or at admission for a one-token
// prompt): each live choice that holds a slot gets a copy of the
// carrier's, the first live one the carrier's slot itself, and they run
// from the prompt's last token. A copy that fails fails its choice.
func (rt *Scheduler) forkLocked(g *group) {
	g.forked = true
	c := g.carrier
	c.killed = true // reaped from running without a final
	src := c.slot
	taken := false
	for _, r := range g.choices {
		if r.killed {
			continue
		}
		r.fed, r.cached, r.admitted = c.fed, c.cached, c.admitted
		if r.slot < 0 && !taken {
			r.slot, taken = src, true
		} else if err := rt.m.Store().Copy(src, r.slot); err != nil {
			rt.completeLocked(r, FinishError, fmt.Sprintf("forking the prefill into choice %d: %v", r.choice, err))
			continue
		}
		rt.running = append(rt.running, r)
	}
	rt.reserved -= g.held
	g.held = 0
	if !taken {
		c.slot = src
		rt.releaseLocked(c) // its choice ended before the fork
	}
	c.slot = -1
}
