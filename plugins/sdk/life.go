package sdk

import (
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/glmflash/glmflash/internal/proctree"
	"github.com/glmflash/glmflash/plugins/protocol"
)

// The plugin's life is tied to the host's. The host gives the plugin the
// read end of a pipe (descriptor protocol.EnvParentFD) whose only write end
// it holds, and asks for SIGTERM when it dies (Pdeathsig, Linux). However
// the host ends (SIGKILL, SIGPIPE from `glmflash passes list | head -1`),
// the pipe reads end of file, and the plugin kills its descendants and
// exits. The plugin is its descendants' child subreaper (Linux), so one
// whose parent exited (a daemon's double fork) stays its descendant; a
// child that called setsid, outside the process group the host kills, is
// killed by the same walk (and by the host's, when the host stops it).

// watchHost starts the watch of the lifeline (when the host gave one) and of
// SIGTERM.
func watchHost() {
	_ = proctree.SetSubreaper() // best effort: without it, orphans of orphans escape
	fd, err := strconv.Atoi(os.Getenv(protocol.EnvParentFD))
	if err == nil && fd > 2 {
		syscall.CloseOnExec(fd) // the plugin's own children do not hold it
		f := os.NewFile(uintptr(fd), "glmflash-lifeline")
		go func() {
			_, _ = io.Copy(io.Discard, f) // the host never writes: this returns when it is gone
			exitWithDescendants("the host is gone (its end of the lifeline closed)")
		}()
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() {
		<-term
		exitWithDescendants("SIGTERM (the host died or is stopping the plugin)")
	}()
}

// exitWithDescendants kills every descendant of the plugin and exits. It
// logs nothing: with the host gone, a write on stderr (a pipe to it) would
// end the plugin by SIGPIPE before its descendants are killed.
func exitWithDescendants(why string) {
	_ = why // for the reader: the cause, as the callers say
	killDescendants()
	os.Exit(1)
}

// killDescendants kills the plugin's descendants.
func killDescendants() { proctree.Kill(proctree.Descendants(os.Getpid())) }
