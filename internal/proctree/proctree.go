// Package proctree finds and kills a process's descendants on Linux, by
// the parent links in /proc: what a process group misses (a child that
// called setsid, or moved to another group). A descendant whose parent
// exited before the walk is reparented (to init, or to the nearest child
// subreaper, see SetSubreaper) and is found only through a subreaper.
package proctree

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Proc is one process: its id and its start time (in clock ticks after
// boot), which together name it even once the id is reused.
type Proc struct {
	PID   int
	Start uint64
}

// stat reads pid's parent and start time from /proc/pid/stat.
func stat(pid int) (ppid int, start uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// the command name (field 2) is in parentheses and may hold anything
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// after the name: state(3) ppid(4) … starttime(22)
	if len(f) < 20 {
		return 0, 0, false
	}
	if f[0] == "Z" || f[0] == "X" { // exited, waiting to be reaped
		return 0, 0, false
	}
	pp, err1 := strconv.Atoi(f[1])
	st, err2 := strconv.ParseUint(f[19], 10, 64)
	return pp, st, err1 == nil && err2 == nil
}

// Descendants lists the live descendants of pid (not pid itself), parents
// before their children; nil where /proc cannot be read.
func Descendants(pid int) []Proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]Proc{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, st, ok := stat(p); ok {
			children[pp] = append(children[pp], Proc{p, st})
		}
	}
	var out []Proc
	queue := []int{pid}
	seen := map[int]bool{pid: true}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !seen[c.PID] {
				seen[c.PID] = true
				out = append(out, c)
				queue = append(queue, c.PID)
			}
		}
	}
	return out
}

// Alive reports whether p still runs (the same process: same start time).
func Alive(p Proc) bool {
	_, st, ok := stat(p.PID)
	return ok && st == p.Start
}

// Kill sends SIGKILL to every process of ps that is still the one listed
// (its start time unchanged: a reused id is left alone); it returns how
// many it signalled.
func Kill(ps []Proc) int {
	n := 0
	for _, p := range ps {
		if Alive(p) && syscall.Kill(p.PID, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}
