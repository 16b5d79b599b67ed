package main

import (
	"fmt"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/spf13/cobra"
)

func newGraphCmd() *cobra.Command {
	var mf modelFlags
	var mode, logits, format string
	var hidden, mtp bool
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
			ck, err := mf.open()
			if err != nil {
				return err
			}
			defer ck.Close()
			opts := graph.Options{Mode: m, Logits: graph.Logits(logits), CaptureHidden: hidden}
			build := graph.Build
			if mtp {
				build = graph.BuildMTP
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
	cmd.Flags().BoolVar(&mtp, "mtp", false, "the MTP (NextN) draft layer's graph instead of the trunk's (a model with num_nextn_predict_layers > 0, e.g. --preset tiny-mtp)")
	return cmd
}
