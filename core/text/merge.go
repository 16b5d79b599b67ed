package text

import (
	"context"
	"sync"
)

// Item is what Merged.Next returns: a chunk or the final of one stream
// (Choice is its index among the merged streams).
type Item struct {
	Choice int
	Chunk  *Chunk
	Final  *Final
}

// Merged reads several streams at once (the choices of a request of n > 1
// choices), one goroutine each, and hands their chunks and finals to one
// reader in the order they come. Close stops the goroutines; every Merged
// must be closed.
type Merged struct {
	ctx   context.Context
	stop  context.CancelFunc
	items chan mergedItem
	wg    sync.WaitGroup
	left  int
}

type mergedItem struct {
	Item
	err error
}

// Merge starts reading streams within ctx.
func Merge(ctx context.Context, streams []*Stream) *Merged {
	ctx, stop := context.WithCancel(ctx)
	m := &Merged{ctx: ctx, stop: stop, items: make(chan mergedItem), left: len(streams)}
	for i, st := range streams {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			for {
				c, f, err := st.Recv(ctx)
				select {
				case m.items <- mergedItem{Item: Item{Choice: i, Chunk: c, Final: f}, err: err}:
				case <-ctx.Done():
					return
				}
				if err != nil || f != nil {
					return
				}
			}
		}()
	}
	return m
}

// Next returns the next chunk or final of any stream; done is true once
// every stream's final was returned. An error is ctx's: it ended first.
func (m *Merged) Next() (it Item, done bool, err error) {
	if m.left == 0 {
		return Item{}, true, nil
	}
	select {
	case x := <-m.items:
		if x.err != nil {
			return Item{}, false, x.err
		}
		if x.Final != nil {
			m.left--
		}
		return x.Item, false, nil
	case <-m.ctx.Done(): // a reader may see it before it sends its error
		return Item{}, false, m.ctx.Err()
	}
}

// Close stops reading and waits for the readers to return.
func (m *Merged) Close() {
	m.stop()
	m.wg.Wait()
}
