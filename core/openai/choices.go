package openai

import (
	"context"
	"sync"

	"github.com/glmflash/glmflash/core/text"
)

// A request of n choices is read by one goroutine per choice (each a text
// stream: its own decoding, stop strings and finish) sending into one
// channel, which the handler alone reads and writes out: streamed chunks
// carry their choice's index, in the order they come.

// choiceMsg is what a choice's reader sends: a chunk, its final, or the
// error that ended the read (the client went away).
type choiceMsg struct {
	i   int
	c   *text.Chunk
	f   *text.Final
	err error
}

// read takes every choice's output until each has its final (streams
// write as it comes). It returns false when the client went away (ctx
// ended). A choice that fails ends the others (abort): a stream then
// writes the error and [DONE] at once (o.ended), a whole response fails
// once every final is in. A failed write (o.err) stops it at once.
func (o *response) read(ctx context.Context, streams []*text.Stream, abort func()) bool {
	ctx, stop := context.WithCancel(ctx)
	msgs := make(chan choiceMsg)
	var wg sync.WaitGroup
	defer func() {
		stop() // readers blocked in Recv or in a send return
		wg.Wait()
	}()
	for i, st := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, f, err := st.Recv(ctx)
				select {
				case msgs <- choiceMsg{i: i, c: c, f: f, err: err}:
				case <-ctx.Done():
					return
				}
				if err != nil || f != nil {
					return
				}
			}
		}()
	}
	left := len(streams)
	for left > 0 {
		var m choiceMsg
		select {
		case m = <-msgs:
		case <-ctx.Done(): // a reader may see it before it sends its error
			return false
		}
		switch {
		case m.err != nil:
			return false
		case m.f == nil:
			o.add(m.i, m.c)
		default:
			left--
			o.choices[m.i].final = m.f
			if e := o.finished(m.i); e != nil {
				abort()
				if o.p.stream {
					o.sse(errorBody(e))
					o.done()
					o.ended = true
					return true
				}
			}
		}
		if o.err != nil {
			return true
		}
	}
	return true
}
