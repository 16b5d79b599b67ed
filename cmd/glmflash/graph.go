package main

import (
	"fmt"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/model"
	"github.com/spf13/cobra"
)

func newGraphCmd() *cobra.Command {
	var mf modelFlags
	var mode, logits, format string
	var hidden, mtp bool
	var dflashDir string
	cmd := &cobra.Command{
		Use:   "graph (--model DIR | --preset NAME)",
		Args:  cobra.NoArgs,
		Short: "Print the forward graph (IR) for a batch mode",
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := graph.ParseMode(mode)
			if err != nil {
				return fmt.Errorf("--mode: %w", err)
			}
			if format != "text" && format != "summary" {
				return fmt.Errorf("--format must be text or summary, got %q", format)
			}
			if logits != string(graph.AllLogits) && logits != string(graph.LastLogits) {
				return fmt.Errorf("--logits must be all or last, got %q", logits)
			}
			if dflashDir != "" && (mtp || hidden) {
				return fmt.Errorf("--dflash prints the DFlash drafter's graph: --mtp and --capture-hidden do not apply to it")
			}
			ck, err := mf.open()
			if err != nil {
				return err
			}
			defer ck.Close()
			opts := graph.Options{Mode: m, Logits: graph.Logits(logits), CaptureHidden: hidden}
			build := graph.Build
			switch {
			case mtp:
				build = graph.BuildMTP
			case dflashDir != "":
				dk, err := model.OpenDFlashFor(dflashDir, ck.Config(), model.OpenOptions{})
				if err != nil {
					return fmt.Errorf("--dflash: %w", err)
				}
				dk.Close() // its config is what the graph needs
				if !cmd.Flags().Changed("mode") {
					opts.Mode = graph.Extend // the drafter's program
				}
				opts.Logits = "" // span logits, the draft graph's only ones
				build = func(cfg *model.Config, o graph.Options) (*ir.Graph, error) {
					return graph.BuildDFlash(cfg, dk.DFlashConfig(), o)
				}
			}
			g, err := build(ck.Config(), opts)
			if err != nil {
				return err
			}
			return printGraph(format, g)
		},
	}
	mf.addConfig(cmd)
	mf.add(cmd, true)
	cmd.Flags().StringVar(&mode, "mode", "prefill", "prefill, decode, extend or mixed")
	cmd.Flags().StringVar(&logits, "logits", "last", "all or last")
	cmd.Flags().StringVar(&format, "format", "text", "text or summary")
	cmd.Flags().BoolVar(&hidden, "capture-hidden", false, "add per-layer hidden-state outputs")
	cmd.Flags().StringVar(&dflashDir, "dflash", "", "a DFlash drafter's checkpoint directory: print its block draft graph (span logits; --mode only labels it)")
	cmd.Flags().BoolVar(&mtp, "mtp", false, "the MTP (NextN) draft layer's graph instead of the trunk's (a model with num_nextn_predict_layers > 0, e.g. --preset tiny-mtp)")
	return cmd
}
