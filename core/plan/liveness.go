package plan

import "github.com/glmflash/glmflash/core/ir"

// Event is one change in a value's liveness: at step Step the value is
// born (before the step runs: one of its outputs) or dies (after it runs:
// the step was its last reader, or no step reads it).
type Event struct {
	Step  int
	Value *ir.Value
	Dies  bool
}

// Liveness is the lifetimes of the values the steps produce, as one list
// of events in step order (each step's births, then its deaths), computed
// once per plan. A backend plans its arena by walking it: allocate at a
// birth, release at a death. Graph inputs and constants are never in it
// (no step produces them); graph outputs are born and never die.
type Liveness struct {
	Events []Event
	// Events[born[i]:dies[i]] are step i's births,
	// Events[dies[i]:born[i+1]] its deaths.
	born, dies []int
}

// Born returns the values step i produces, in output order.
func (l *Liveness) Born(i int) []Event { return l.Events[l.born[i]:l.dies[i]] }

// Dies returns the values whose lifetime ends after step i: its inputs
// that no later step reads (in input order, each once), then its outputs
// that no step reads.
func (l *Liveness) Dies(i int) []Event { return l.Events[l.dies[i]:l.born[i+1]] }

// Steps is the number of steps the list covers.
func (l *Liveness) Steps() int { return len(l.dies) }

// NewLiveness computes the event list of steps (in execution order) from
// lastUse (a value's last reader, math.MaxInt for a graph output; absent:
// never read), as Compile does for Plan.Life.
func NewLiveness(steps []*ir.Node, lastUse map[*ir.Value]int) *Liveness {
	l := &Liveness{born: make([]int, len(steps)+1), dies: make([]int, len(steps))}
	made := map[*ir.Value]bool{}
	for si, n := range steps {
		l.born[si] = len(l.Events)
		for _, o := range n.Outputs {
			made[o] = true
			l.Events = append(l.Events, Event{Step: si, Value: o})
		}
		l.dies[si] = len(l.Events)
		for _, in := range n.Inputs {
			if made[in] && lastUse[in] == si {
				made[in] = false // each once
				l.Events = append(l.Events, Event{Step: si, Value: in, Dies: true})
			}
		}
		for _, o := range n.Outputs {
			if _, used := lastUse[o]; !used {
				made[o] = false
				l.Events = append(l.Events, Event{Step: si, Value: o, Dies: true})
			}
		}
	}
	l.born[len(steps)] = len(l.Events)
	return l
}
