package safetensors

import (
	"fmt"
	"runtime"
	"sort"
	"sync"
	"time"
	"unsafe"
)

// identity is a file's identity as Check compares it.
type identity struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // nanoseconds since the epoch
}

// diff says how now differs from id ("" when it does not).
func (id identity) diff(now identity) string {
	switch {
	case now.dev != id.dev || now.ino != id.ino:
		return fmt.Sprintf("device/inode %d/%d, was %d/%d", now.dev, now.ino, id.dev, id.ino)
	case now.size != id.size:
		return fmt.Sprintf("size %d bytes, was %d", now.size, id.size)
	case now.mtime != id.mtime:
		return fmt.Sprintf("modified at %s, was %s", stamp(now.mtime), stamp(id.mtime))
	case now.ctime != id.ctime:
		return fmt.Sprintf("status changed at %s, was %s", stamp(now.ctime), stamp(id.ctime))
	}
	return ""
}

func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// mappings lists the open Guarded mappings by address, for Fault.
var mappings struct {
	sync.RWMutex
	files []*File // sorted by start address
}

func start(f *File) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(f.data))) }

func register(f *File) {
	mappings.Lock()
	defer mappings.Unlock()
	fs := append(mappings.files, f)
	sort.Slice(fs, func(i, j int) bool { return start(fs[i]) < start(fs[j]) })
	mappings.files = fs
}

func unregister(f *File) {
	mappings.Lock()
	defer mappings.Unlock()
	for i, g := range mappings.files {
		if g == f {
			mappings.files = append(mappings.files[:i:i], mappings.files[i+1:]...)
			return
		}
	}
}

// Fault turns a memory fault at addr into the error of the Guarded file
// whose mapping holds addr, and refuses that file from then on (Check,
// Bytes); nil when addr is in no open mapping (the fault is not a
// checkpoint's). A reader that runs with debug.SetPanicOnFault(true)
// calls it with the recovered runtime.Error's Addr().
func Fault(addr uintptr) error {
	mappings.RLock()
	defer mappings.RUnlock()
	fs := mappings.files
	i := sort.Search(len(fs), func(i int) bool { return start(fs[i])+uintptr(len(fs[i].data)) > addr })
	if i == len(fs) || addr < start(fs[i]) {
		return nil
	}
	f := fs[i]
	off := int64(addr - start(f))
	why := "its file was truncated or rewritten while it was served"
	if now, err := identityOf(f.fd); err == nil && now.size <= off {
		why = fmt.Sprintf("its file was truncated to %d bytes while it was served (it had %d)", now.size, f.identity.size)
	}
	return f.breakWith(fmt.Errorf("safetensors %s: reading the memory-mapped weights at byte %d faulted (SIGBUS: %s): refusing to serve them (model.weights: guarded; copy holds them in memory instead)", f.path, off, why))
}

// FaultOf returns Fault's error for a value recovered from a panic: nil
// when it is not a memory fault in an open Guarded mapping.
func FaultOf(r any) error {
	e, ok := r.(interface {
		runtime.Error
		Addr() uintptr
	})
	if !ok {
		return nil
	}
	return Fault(e.Addr())
}
