package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/glmflash/glmflash/core/attrib"
	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
	_ "github.com/glmflash/glmflash/passes/all" // register built-in passes
	"github.com/glmflash/glmflash/plugins/host"
	"github.com/spf13/cobra"
)

// pipelineFor builds the pass pipeline of a configuration (built-in and
// plugin passes).
func pipelineFor(ec *config.Config) (*pass.Pipeline, error) {
	pl, err := pipelineWithPlugins(ec) // built-in and plugin passes (plugins_hook.go)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ec.Source, err)
	}
	return pl, nil
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
				r, _ := pass.Lookup(name)
				d, err := r.Describe()
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
	var dflashDir string
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
			if dflashDir != "" && mtp {
				return fmt.Errorf("--dflash and --mtp name two draft graphs: give one")
			}
			if dflashDir != "" && logits != string(graph.SpanLogits) && cmd.Flags().Changed("logits") {
				return fmt.Errorf("--logits: the DFlash draft graph's logits are spans (each block's last B−1 rows), got %q", logits)
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
			pl, err := pipelineFor(ec)
			if err != nil {
				return err
			}
			if err := ec.CheckModel(ck.Config()); err != nil {
				return fmt.Errorf("%s: %w", ec.Source, err)
			}
			env := engine.FromConfig(ec, engine.Setup{Model: ck.Config(), Weights: ck, Pipeline: pl}).PassEnv // what an engine's passes see (its device too)
			if dump != "" {
				pl.Instrument(pass.Dumps(func(p, when, text string) {
					if dump == "both" || dump == when {
						fmt.Printf("=== %s: graph %s\n%s", p, when, text)
					}
				}))
			}
			opts := graph.Options{Mode: m, Logits: graph.Logits(logits)}
			build, prog := graph.Build, fmt.Sprintf("%s/%s", m, logits)
			switch {
			case mtp:
				build, prog = graph.BuildMTP, "mtp:"+prog
				opts.IndexShare = share
			case dflashDir != "":
				dk, err := model.OpenDFlashFor(dflashDir, ck.Config(), model.OpenOptions{})
				if err != nil {
					return fmt.Errorf("--dflash: %w", err)
				}
				dk.Close() // its config is what the graph needs
				d := dk.DFlashConfig()
				if !cmd.Flags().Changed("mode") {
					opts.Mode = graph.Extend // the drafter's program (speculative.DFlashKey)
				}
				opts.Logits, prog = "", fmt.Sprintf("dflash:%s/%s", opts.Mode, graph.SpanLogits)
				build = func(cfg *model.Config, o graph.Options) (*ir.Graph, error) { return graph.BuildDFlash(cfg, d, o) }
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
	explain.Flags().StringVar(&dflashDir, "dflash", "", "a DFlash drafter's checkpoint directory: its block draft graph (span logits; --mode only labels it), e.g. the dflash/ of init-random --preset tiny-dflash")
	explain.Flags().IntVar(&share, "index-share", 0, "with --mtp: index_share_for_mtp_iteration over this many draft steps (0: off)")
	explain.Flags().StringVar(&dump, "dump", "", "print the IR around each pass: before, after or both")
	explain.Flags().StringVar(&format, "format", "text", "text or json")
	cmd.AddCommand(explain)
	cmd.AddCommand(newPassesBenchCmd())
	return cmd
}

// newPassesBenchCmd is `glmflash passes bench`: each pass on and off,
// interleaved, per step.
func newPassesBenchCmd() *cobra.Command {
	var mf modelFlags
	var names []string
	var against, jsonOut string
	var prompt, steps, rounds, warmup int
	var batches []int
	cmd := &cobra.Command{
		Use:   "bench (--model DIR | --preset NAME) [--pass NAME]...",
		Args:  cobra.NoArgs,
		Short: "Micro-benchmark every pass on and off, interleaved: wall and device time, launches, kernels and host syncs per prefill and decode step, with 95% intervals",
		RunE: func(cmd *cobra.Command, args []string) error {
			if prompt < 1 || steps < 1 || rounds < 1 || warmup < 0 || rounds+warmup > maxBenchRuns {
				return fmt.Errorf("--prompt, --steps and --rounds must be ≥ 1, --warmup ≥ 0, --rounds + --warmup at most %d", maxBenchRuns)
			}
			for _, b := range batches {
				if b < 1 || b > maxBenchBatch {
					return fmt.Errorf("--batch values must be in [1, %d], got %d", maxBenchBatch, b)
				}
			}
			if against != "baseline" && against != "all" {
				return fmt.Errorf("--against must be baseline or all, got %q", against)
			}
			ec, err := mf.config()
			if err != nil {
				return err
			}
			ck, err := mf.open()
			if err != nil {
				return err
			}
			defer ck.Close()
			if limit := ck.Config().MaxPositionEmbeddings; prompt > limit || 32+steps > limit {
				return fmt.Errorf("--prompt (%d) and 32 + --steps (%d) must fit max_position_embeddings (%d)", prompt, 32+steps, limit)
			}
			var passes []config.PassConfig
			enabled := ec.Enabled()
			for _, n := range names {
				i := slices.IndexFunc(enabled, func(p config.PassConfig) bool { return p.Name == n })
				switch {
				case i >= 0:
					passes = append(passes, enabled[i])
				default:
					if _, ok := pass.Lookup(n); !ok {
						return fmt.Errorf("--pass %s: no such pass", n)
					}
					passes = append(passes, config.PassConfig{Name: n})
				}
			}
			pb := &attrib.PassBench{Model: ck.Config(), Weights: ck, Info: ck, Base: ec,
				Pipeline: func(e *config.Config) (*pass.Pipeline, error) { return pipelineWithPlugins(e) },
				Passes:   passes, Against: against, Prompt: prompt, Steps: steps, Rounds: rounds, Warmup: warmup, Batches: batches,
				Progress: func(s string) { log.Info().Str("at", s).Msg("passes bench") }}
			res, err := pb.Run(cmd.Context())
			if err != nil {
				return err
			}
			cfg := ck.Config()
			fmt.Printf("model %s (hidden %d, %d layers); device %s; prompt %d, decode batches %v, %d steps per measurement\n", ck.Dir(), cfg.HiddenSize, cfg.NumHiddenLayers, ec.Device, prompt, batches, steps)
			if err := attrib.WritePassBench(os.Stdout, res); err != nil {
				return err
			}
			if jsonOut != "" {
				b, err := json.MarshalIndent(map[string]any{"model": ck.Dir(), "device": ec.Device, "precision": ec.Precision, "results": res}, "", "  ")
				if err != nil {
					return err
				}
				return os.WriteFile(jsonOut, b, 0o644)
			}
			return nil
		},
	}
	mf.addConfig(cmd)
	mf.addDevice(cmd)
	mf.addPrecision(cmd)
	mf.add(cmd, true)
	cmd.Flags().StringSliceVar(&names, "pass", nil, "passes to measure (repeatable; default: every pass the configuration enables)")
	cmd.Flags().StringVar(&against, "against", "baseline", "baseline: each pass alone against no passes; all: every pass against every pass but one")
	cmd.Flags().IntVar(&prompt, "prompt", 512, "prefill prompt length")
	cmd.Flags().IntSliceVar(&batches, "batch", []int{1, 8}, "decode batch sizes")
	cmd.Flags().IntVar(&steps, "steps", 16, "decode steps per measurement")
	cmd.Flags().IntVar(&rounds, "rounds", 5, "measured rounds (paired, interleaved)")
	cmd.Flags().IntVar(&warmup, "warmup", 1, "warm-up rounds (not counted)")
	cmd.Flags().StringVar(&jsonOut, "json", "", "also write the results as JSON to this file")
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
	ec, err := mf.config()
	if err != nil {
		return nil, err
	}
	return newEngineFrom(ec, ck, engine.Setup{Slots: slots})
}

// newEngineFrom makes an engine over ck as configuration ec and s say
// (engine.FromConfig), with ec's pass pipeline (plugins included).
func newEngineFrom(ec *config.Config, ck *model.Checkpoint, s engine.Setup) (*engine.Engine, error) {
	pl, err := pipelineFor(ec)
	if err != nil {
		return nil, err
	}
	if err := ec.CheckModel(ck.Config()); err != nil {
		return nil, fmt.Errorf("%s: %w", ec.Source, err)
	}
	s.Model, s.Weights, s.Pipeline = ck.Config(), ck, pl
	eo := engine.FromConfig(ec, s)
	if err := fillDummy(eo.Device, ck); err != nil {
		return nil, err
	}
	return engine.New(ck.Config(), ck, eo)
}
