// Package parallel splits loops across the machine's cores.
package parallel

import (
	"runtime"
	"sync"
)

// Workers is the number of goroutines For uses; it defaults to GOMAXPROCS.
// Setting it to 1 makes every kernel run sequentially (useful for profiling).
var Workers = runtime.GOMAXPROCS(0)

// For calls fn(lo, hi) over disjoint sub-ranges covering [0, n). Ranges have
// at least grain elements so that tiny loops are not split. It returns when
// every call has returned.
func For(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	w := Workers
	if max := (n + grain - 1) / grain; w > max {
		w = max
	}
	if w <= 1 {
		fn(0, n)
		return
	}
	chunk := (n + w - 1) / w
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += chunk {
		hi := lo + chunk
		if hi > n {
			hi = n
		}
		if hi == n {
			fn(lo, hi)
			break
		}
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, hi)
	}
	wg.Wait()
}

// Each calls fn(i) for every i in [0, n), spreading the indices over the
// workers dynamically (good for uneven work items such as attention heads of
// sequences with different lengths).
func Each(n int, fn func(i int)) {
	w := Workers
	if w > n {
		w = n
	}
	if w <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	next := 0
	take := func() int {
		mu.Lock()
		defer mu.Unlock()
		i := next
		next++
		return i
	}
	for g := 0; g < w; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := take(); i < n; i = take() {
				fn(i)
			}
		}()
	}
	wg.Wait()
}
