package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
	_ "github.com/glmflash/glmflash/passes/all" // register built-in passes
	"github.com/glmflash/glmflash/plugins/host"
	"github.com/spf13/cobra"
)

// pipelineFor builds the pass pipeline and eligibility environment for a
// checkpoint and configuration.
func pipelineFor(ec *config.Config, ck *model.Checkpoint) (*pass.Pipeline, *pass.Env, error) {
	pl, err := pipelineWithPlugins(ec) // built-in and plugin passes (plugins_hook.go)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", ec.Source, err)
	}
	return pl, ec.PassEnv(ck.Config(), ck), nil
}

func newPassesCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "passes", Short: "List passes and explain what they do to a model"}
	var lf modelFlags
	list := &cobra.Command{
		Use:   "list [--config FILE]",
		Args:  cobra.NoArgs,
		Short: "List the passes (built-in, and with --config the plugins of its plugins.dir) with their options and defaults",
		RunE: func(cmd *cobra.Command, args []string) error {
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			for _, name := range pass.Names() {
				f, _ := pass.Lookup(name)
				d, err := pass.DescriptionOf(f())
				if err != nil {
					return err
				}
				describePass(tw, d, "built-in")
			}
			if len(lf.files) > 0 {
				ec, err := lf.config()
				if err != nil {
					return err
				}
				if ec.Plugins.Dir != "" {
					h, err := host.Open(host.OptionsFromConfig(ec, log))
					if err != nil {
						return fmt.Errorf("%s: %w", ec.Source, err)
					}
					defer h.Close()
					for _, p := range h.Plugins() {
						if err := p.Err(); err != nil {
							fmt.Fprintf(tw, "%s	plugin %s	NOT LOADED: %v\n", p.Name, p.File, err)
							continue
						}
						describePass(tw, p.Desc, "plugin "+p.File)
					}
					for _, why := range h.Ignored() {
						fmt.Fprintf(tw, "-\tplugin\tNOT LOADED: %s\n", why)
					}
				}
			}
			return tw.Flush()
		},
	}
	lf.addConfig(list)
	cmd.AddCommand(list)
	var mf modelFlags
	var mode, logits, dump, format string
	var mtp bool
	var share int
	explain := &cobra.Command{
		Use:   "explain (--model DIR | --preset NAME) [--config FILE]",
		Args:  cobra.NoArgs,
		Short: "Run the configured passes on a model's graph and print the report (fired sites, skipped sites with reasons)",
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := graph.ParseMode(mode)
			if err != nil {
				return err
			}
			if dump != "" && dump != "before" && dump != "after" && dump != "both" {
				return fmt.Errorf("--dump must be before, after or both, got %q", dump)
			}
			if format != "text" && format != "json" {
				return fmt.Errorf("--format must be text or json, got %q", format)
			}
			switch graph.Logits(logits) {
			case "":
				logits = string(graph.LastLogits)
				if m == graph.Verify && !mtp {
					logits = string(graph.SpanLogits)
				}
			case graph.AllLogits, graph.LastLogits, graph.SpanLogits:
			default:
				return fmt.Errorf("--logits must be all, last or spans, got %q", logits)
			}
			if share != 0 && !mtp {
				return fmt.Errorf("--index-share applies to the MTP graph (--mtp)")
			}
			ec, err := mf.config()
			if err != nil {
				return err
			}
			dev := ec.Device
			// the device must exist: a pass may depend on it, and a wrong
			// device is better found here than at serving time
			be, err := backend.Open(dev, backend.Options{})
			if err != nil {
				return fmt.Errorf("--device %s: %w", dev, err)
			}
			devName := be.Info().Device
			be.Close()
			ck, err := mf.open()
			if err != nil {
				return err
			}
			defer ck.Close()
			pl, env, err := pipelineFor(ec, ck)
			if err != nil {
				return err
			}
			env.Device = dev
			if dump != "" {
				pl.Dump = func(p, when, text string) {
					if dump == "both" || dump == when {
						fmt.Printf("=== %s: graph %s\n%s", p, when, text)
					}
				}
			}
			opts := graph.Options{Mode: m, Logits: graph.Logits(logits)}
			build, prog := graph.Build, fmt.Sprintf("%s/%s", m, logits)
			switch {
			case mtp:
				build, prog = graph.BuildMTP, "mtp:"+prog
				opts.IndexShare = share
			case m == graph.Verify:
				opts.FinalHidden = true // what a drafter reading hidden rows asks
			}
			g, err := build(ck.Config(), opts)
			if err != nil {
				return err
			}
			env.Program = fmt.Sprintf("%s on %s [%s] (config %s)", prog, dev, devName, ec.Source)
			rep, err := pl.Run(g, env)
			if err != nil {
				return err
			}
			if format == "json" {
				fmt.Println(rep.JSON())
			} else {
				fmt.Print(rep.String())
			}
			return nil
		},
	}
	mf.addConfig(explain)
	mf.addDevice(explain)
	mf.add(explain, true)
	explain.Flags().StringVar(&mode, "mode", "decode", "graph to explain: prefill, decode, extend, mixed or verify (speculative decoding's verify batch; with --mtp: the draft extend after acceptance)")
	explain.Flags().StringVar(&logits, "logits", "", "all, last or spans (default: spans for --mode verify, else last)")
	explain.Flags().BoolVar(&mtp, "mtp", false, "the MTP (NextN) draft layer's graph (--mode decode: a draft step, extend or verify: the draft extend)")
	explain.Flags().IntVar(&share, "index-share", 0, "with --mtp: index_share_for_mtp_iteration over this many draft steps (0: off)")
	explain.Flags().StringVar(&dump, "dump", "", "print the IR around each pass: before, after or both")
	explain.Flags().StringVar(&format, "format", "text", "text or json")
	cmd.AddCommand(explain)
	return cmd
}

// describePass writes one pass's line, its requirements and its options.
func describePass(w io.Writer, d pass.Description, source string) {
	fmt.Fprintf(w, "%s\tv%s\t%s\t%s\n", d.Name, d.Version, source, d.Summary)
	if len(d.Requires) > 0 {
		fmt.Fprintf(w, "\t\t\t  requires %s\n", strings.Join(d.Requires, ", "))
	}
	for _, o := range d.Options {
		enum := ""
		if len(o.Enum) > 0 {
			enum = " (" + strings.Join(o.Enum, "|") + ")"
		}
		def := fmt.Sprint(o.Default)
		if o.Type == pass.String || o.Type == pass.PathType {
			def = fmt.Sprintf("%q", o.Default)
		}
		fmt.Fprintf(w, "\t\t\t  %s: %s = %s%s: %s\n", o.Name, o.Type, def, enum, o.Doc)
	}
}

// newEngine makes an engine over ck with the passes, device and precision
// of the command's configuration.
func newEngine(ck *model.Checkpoint, mf *modelFlags, slots int) (*engine.Engine, error) {
	return newEngineWith(ck, mf, slots, 0, nil)
}

// newEngineWith is newEngine with stores that roll back rollback positions
// (speculative decoding) and a last say on the backend options.
func newEngineWith(ck *model.Checkpoint, mf *modelFlags, slots, rollback int, adjust func(*backend.Options)) (*engine.Engine, error) {
	ec, err := mf.config()
	if err != nil {
		return nil, err
	}
	pl, env, err := pipelineFor(ec, ck)
	if err != nil {
		return nil, err
	}
	bo := backendOptions(ec)
	if adjust != nil {
		adjust(&bo)
	}
	return engine.New(ck.Config(), ck, engine.Options{Slots: slots, Rollback: rollback, Passes: pl, PassEnv: env, Device: ec.Device, Backend: bo})
}

// backendOptions are the backend settings of a configuration.
func backendOptions(ec *config.Config) backend.Options {
	return backend.Options{GraphMaxTokens: ec.CUDA.GraphMaxTokens, Precision: ec.Precision}
}
