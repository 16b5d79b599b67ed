package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/glmflash/glmflash/plugins/host"
)

// withSignals returns a context that the first SIGINT or SIGTERM cancels
// (serve drains, attribute stops); plugin processes still starting are
// killed then, so that nothing waits on them. A second signal forces the
// exit at once (exit status 130) after killing every plugin process group.
// stop releases the handler.
func withSignals(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		n := 0
		for {
			select {
			case s := <-ch:
				n++
				if n == 1 {
					log.Warn().Str("signal", s.String()).Msg("stopping (a second Ctrl-C forces the exit)")
					host.KillStarting()
					cancel()
					continue
				}
				log.Error().Str("signal", s.String()).Msg("second signal: forcing the exit")
				host.KillAll()
				os.Exit(130)
			case <-done:
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}
