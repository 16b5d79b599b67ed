// Command glmflash is the engine's one binary: evaluate against reference
// fixtures, generate, benchmark, write random real-format checkpoints.
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

var (
	logLevel  string
	logFormat string
	log       zerolog.Logger
)

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Version:       version(),
		Use:           "glmflash",
		Short:         "An inference engine for GLM-5.3-Flash (glm5_next) models whose optimizations are graph passes",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			lvl, err := zerolog.ParseLevel(logLevel)
			if err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			switch logFormat {
			case "console":
				log = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly}).With().Timestamp().Logger().Level(lvl)
			case "json":
				log = zerolog.New(os.Stderr).With().Timestamp().Logger().Level(lvl)
			default:
				return fmt.Errorf("--log-format must be console or json, got %q", logFormat)
			}
			return nil
		},
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level (debug, info, warn, error)")
	root.PersistentFlags().StringVar(&logFormat, "log-format", "console", "log format (console or json)")
	bench := newBenchCmd()
	bench.AddCommand(newBenchServeCmd()) // glmflash bench serve: the load generator (its flags are its own)
	root.AddCommand(newEvalCmd(), newGenerateCmd(), bench, newInitRandomCmd(), newGraphCmd(), newPassesCmd(), newServeCmd(), newAttributeCmd(), newPluginCmd())
	return root
}

// revision is set by the Makefile (-ldflags -X) for builds where Go's own
// VCS stamping is off (GOFLAGS=-buildvcs=false, git worktrees).
var revision string

// buildRevision is the VCS revision the binary was built from and whether
// the tree had changes (Go's build stamp); rev is empty without a stamp.
func buildRevision() (rev, when string, modified bool) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", "", false
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		case "vcs.time":
			when = s.Value
		}
	}
	return rev, when, modified
}

// version is the module version and VCS revision the binary was built
// from (Go's build information).
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	rev, when, modified := buildRevision()
	switch {
	case rev != "":
		mod := ""
		if modified {
			mod = "+modified"
		}
		v += fmt.Sprintf(" (%s%s, %s)", rev[:min(12, len(rev))], mod, when)
	case revision != "":
		v += " (" + revision + ")"
	}
	return v + " " + bi.GoVersion
}

func main() {
	err := newRoot().Execute()
	closePlugins() // pass plugins end with the command
	if err != nil {
		fmt.Fprintln(os.Stderr, "glmflash:", err)
		os.Exit(1)
	}
}
