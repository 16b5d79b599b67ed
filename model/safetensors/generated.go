package safetensors

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// Generated is the mode of a File made by NewGenerated: its tensors are
// made in memory by a function instead of read from a file.
const Generated Mode = 2

// GenTensor describes one tensor of a generated File.
type GenTensor struct {
	Name  string
	DType DType
	Shape []int
}

func (t GenTensor) bytes() (int64, error) {
	if t.DType.Size() == 0 {
		return 0, fmt.Errorf("tensor %s: dtype %s has no size", t.Name, t.DType)
	}
	n := int64(t.DType.Size())
	for _, d := range t.Shape {
		if d < 0 {
			return 0, fmt.Errorf("tensor %s: negative dimension in shape %v", t.Name, t.Shape)
		}
		n *= int64(d)
	}
	return n, nil
}

// GenFill fills the tensors of group g (NewGenerated's groups[g], in that
// order): dst[i] is tensor i's bytes, zeroed, of exactly its size. It must
// write the same bytes every time it is called for a group: a group whose
// bytes were released is filled again when it is next asked for.
type GenFill func(g int, dst [][]byte) error

// genGroup is one group's state: its tensors' bytes (nil until filled) and
// how many handed-out slices of them are still held.
type genGroup struct {
	mu    sync.Mutex
	specs []GenTensor
	size  int64
	data  []byte // every member's bytes, end to end; nil when not filled
	free  func([]byte) error
	holds int
	// pinned: Fill holds the group for as long as the File is open.
	pinned bool
}

// generation is a generated File's tensors.
type generation struct {
	fill   GenFill
	groups []*genGroup
	of     map[string]int // tensor name → group
	mu     sync.Mutex     // resident
	bytes  int64          // bytes filled and not released
	fills  int64          // group fills so far (a refill counts again)
}

// NewGenerated returns a File whose tensors are made by fill instead of
// read: groups lists them (tensors made together, such as an FP8 weight and
// its block scale, form one group), and name stands for a path in
// messages. A group is filled the first time one of its tensors' bytes is
// asked for (Bytes), in memory of its own (anonymous memory off the Go heap
// where there is, else the heap), in parallel with other groups' fills.
//
// Every slice Bytes hands out is a hold on its group; Release gives one
// back, and a group none of whose slices is held any more is freed (and
// filled again, with the same bytes, if asked for later). A reader that
// reads the bytes in place for as long as the File is open simply never
// releases them. Check and VerifyHeader have nothing to check (nil).
func NewGenerated(name string, groups [][]GenTensor, md map[string]string, fill GenFill) (*File, error) {
	if fill == nil {
		return nil, fmt.Errorf("safetensors %s: no fill function", name)
	}
	gen := &generation{fill: fill, of: map[string]int{}}
	infos := map[string]TensorInfo{}
	for gi, g := range groups {
		if len(g) == 0 {
			return nil, fmt.Errorf("safetensors %s: group %d is empty", name, gi)
		}
		gg := &genGroup{specs: slices.Clone(g)}
		for _, t := range g {
			if t.Name == "" {
				return nil, fmt.Errorf("safetensors %s: a tensor of group %d has no name", name, gi)
			}
			if _, dup := gen.of[t.Name]; dup {
				return nil, fmt.Errorf("safetensors %s: tensor %s is listed twice", name, t.Name)
			}
			n, err := t.bytes()
			if err != nil {
				return nil, fmt.Errorf("safetensors %s: %w", name, err)
			}
			gen.of[t.Name] = gi
			// Begin/End: offsets within the group's memory
			infos[t.Name] = TensorInfo{Name: t.Name, DType: t.DType, Shape: slices.Clone(t.Shape), Begin: gg.size, End: gg.size + n}
			gg.size += n
		}
		gen.groups = append(gen.groups, gg)
	}
	return &File{path: name, mode: Generated, infos: infos, metadata: md, gen: gen}, nil
}

// Generated reports whether the File's tensors are made in memory
// (NewGenerated) rather than read from a file.
func (f *File) Generated() bool { return f.gen != nil }

// Release gives back one hold on the named tensor's bytes, taken by Bytes:
// the caller no longer reads that slice. On a generated File, a group none
// of whose slices is held any more is freed. Files read from disk hold
// their bytes until Close: Release does nothing there.
func (f *File) Release(name string) {
	if f.gen == nil || f.closed {
		return
	}
	gi, ok := f.gen.of[name]
	if !ok {
		return
	}
	f.gen.release(f.gen.groups[gi])
}

// ResidentBytes is the memory the File's tensor bytes take now: a generated
// File's filled groups, a copy's size, 0 for a mapping (the page cache's).
func (f *File) ResidentBytes() int64 {
	switch {
	case f.gen != nil:
		f.gen.mu.Lock()
		defer f.gen.mu.Unlock()
		return f.gen.bytes
	case f.mapped || f.closed:
		return 0
	}
	return int64(len(f.data))
}

// Fills is how many times a generated File's groups were filled (a group
// released and asked for again counts twice); 0 for other files.
func (f *File) Fills() int64 {
	if f.gen == nil {
		return 0
	}
	f.gen.mu.Lock()
	defer f.gen.mu.Unlock()
	return f.gen.fills
}

// acquire returns tensor t's bytes, filling its group first when it is
// not, and takes a hold on them.
func (gen *generation) acquire(path string, t TensorInfo) ([]byte, error) {
	g := gen.groups[gen.of[t.Name]]
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.data == nil {
		if err := gen.fillGroup(gen.of[t.Name], g); err != nil {
			return nil, fmt.Errorf("safetensors %s: generating %s: %w", path, t.Name, err)
		}
	}
	g.holds++
	return g.data[t.Begin:t.End:t.End], nil
}

// fillGroup allocates and fills g (g.mu held).
func (gen *generation) fillGroup(gi int, g *genGroup) error {
	var buf []byte
	var free func([]byte) error
	if g.size > 0 {
		b, fr, err := allocCopy(g.size)
		if err != nil {
			b, fr = make([]byte, g.size), nil
		}
		buf, free = b, fr
	} else {
		buf = []byte{}
	}
	dst := make([][]byte, len(g.specs))
	var off int64
	for i, t := range g.specs {
		n, _ := t.bytes()
		dst[i] = buf[off : off+n : off+n]
		off += n
	}
	if err := gen.fill(gi, dst); err != nil {
		if free != nil {
			_ = free(buf)
		}
		return err
	}
	g.data, g.free = buf, free
	gen.mu.Lock()
	gen.bytes += g.size
	gen.fills++
	gen.mu.Unlock()
	return nil
}

func (gen *generation) release(g *genGroup) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holds == 0 { // an unmatched release: nothing is held
		return
	}
	if g.holds--; g.holds > 0 || g.data == nil {
		return
	}
	gen.drop(g)
}

// drop frees g's bytes (g.mu held).
func (gen *generation) drop(g *genGroup) error {
	data, free := g.data, g.free
	g.data, g.free, g.holds, g.pinned = nil, nil, 0, false
	gen.mu.Lock()
	gen.bytes -= g.size
	gen.mu.Unlock()
	if free != nil && len(data) > 0 {
		return free(data)
	}
	return nil
}

// close frees every filled group.
func (gen *generation) close() error {
	var errs []error
	for _, g := range gen.groups {
		g.mu.Lock()
		if g.data != nil {
			errs = append(errs, gen.drop(g))
		}
		g.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Fill makes every group of a generated File that is not made yet, workers
// groups at a time (a large group's fill is parallel itself), for a reader
// that reads all of them and keeps them (the CPU backend reads every weight
// in place): it holds every group until the File closes, as a checkpoint's
// copy in memory is held, so that no reader's Release frees one. It does
// nothing on other files; the first error stops it.
func (f *File) Fill(workers int) error {
	if f.gen == nil {
		return nil
	}
	if f.closed {
		return fmt.Errorf("safetensors %s: file is closed", f.path)
	}
	gen := f.gen
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range max(1, workers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(gen.groups) {
					return
				}
				g := gen.groups[i]
				g.mu.Lock()
				var err error
				if g.data == nil {
					err = gen.fillGroup(i, g)
				}
				if err == nil && !g.pinned {
					g.pinned = true
					g.holds++
				}
				g.mu.Unlock()
				if err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("safetensors %s: generating %s: %w", f.path, g.specs[0].Name, err)
					}
					mu.Unlock()
					next.Store(int64(len(gen.groups))) // stop the others
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}
