package openai

import (
	"context"

	"github.com/glmflash/glmflash/core/text"
)

// A request of n choices is read by one text stream per choice (its own
// decoding, stop strings and finish), merged (text.Merge): the handler
// alone writes, streamed chunks carrying their choice's index in the
// order they come.

// read takes every choice's output until each has its final (streams
// write as it comes). It returns false when the client went away (ctx
// ended). A choice that fails ends the others (abort): a stream then
// writes the error and [DONE] at once (o.ended), a whole response fails
// once every final is in. A failed write (o.err) stops it at once.
func (o *response) read(ctx context.Context, streams []*text.Stream, abort func()) bool {
	m := text.Merge(ctx, streams)
	defer m.Close()
	for {
		it, done, err := m.Next()
		switch {
		case err != nil:
			return false
		case done:
			return true
		case it.Final == nil:
			o.add(it.Choice, it.Chunk)
		default:
			o.choices[it.Choice].final = it.Final
			if e := o.finished(it.Choice); e != nil {
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
}
