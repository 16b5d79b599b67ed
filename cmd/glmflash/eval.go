package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/glmflash/glmflash/core/eval"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/model"
	"github.com/spf13/cobra"
)

func newEvalCmd() *cobra.Command {
	var mf modelFlags
	var refPath, dump string
	var tol float64
	cmd := &cobra.Command{
		Use:   "eval --model DIR --reference FILE",
		Args:  cobra.NoArgs,
		Short: "Run every case of a transformers reference file and compare logits and greedy tokens",
		RunE: func(cmd *cobra.Command, args []string) error {
			if refPath == "" {
				return fmt.Errorf("--reference is required")
			}
			if tol <= 0 {
				return fmt.Errorf("--tol must be > 0")
			}
			ck, err := mf.open()
			if err != nil {
				return err
			}
			defer ck.Close()
			if err := dumpGraph(dump, ck.Config(), graph.Prefill, graph.AllLogits); err != nil {
				return err
			}
			jsonPath := strings.TrimSuffix(refPath, filepath.Ext(refPath)) + ".json"
			if eval.IsMTPReference(jsonPath) {
				return evalMTP(ck, &mf, refPath, tol)
			}
			ref, err := eval.Load(refPath)
			if err != nil {
				return err
			}
			e, err := newEngine(ck, &mf, 2)
			if err != nil {
				return err
			}
			defer e.Close()
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "case\tkind\trows\tmax|Δlogit|\tgreedy\tresult")
			failed := 0
			for i := range ref.Cases {
				r, err := eval.RunCase(e, &ref.Cases[i], ref.Vocab)
				if err != nil {
					return fmt.Errorf("case %s: %w", ref.Cases[i].Name, err)
				}
				verdict := "ok"
				if !r.Pass(tol) {
					verdict = "FAIL"
					failed++
				}
				greedy := "match"
				if !r.GreedyMatch {
					greedy = fmt.Sprintf("%d differ", r.Mismatches)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%.2e\t%s\t%s\n", r.Name, r.Kind, r.Rows, r.MaxAbsDiff, greedy, verdict)
			}
			tw.Flush()
			if failed > 0 {
				return fmt.Errorf("%d of %d cases exceed --tol %g or change a greedy token", failed, len(ref.Cases), tol)
			}
			fmt.Printf("all %d cases within %g, greedy tokens identical\n", len(ref.Cases), tol)
			return nil
		},
	}
	mf.addConfig(cmd)
	mf.addDevice(cmd)
	mf.addPrecision(cmd)
	mf.add(cmd, false)
	mf.addCheckTensors(cmd)
	cmd.Flags().StringVar(&refPath, "reference", "", "reference.safetensors (with reference.json beside it; an MTP reference runs the trunk and the MTP layer)")
	cmd.Flags().Float64Var(&tol, "tol", 1e-3, "largest allowed max |Δlogit| per case")
	cmd.Flags().StringVar(&dump, "dump-graph", "", "print the prefill graph first: summary or text")
	return cmd
}

// evalMTP runs an MTP reference (format glmflash-mtp-reference/1): per case
// the trunk's logits and final hidden state, the MTP layer's prefill and
// draft steps on the reference's inputs, and the engine's own chain.
func evalMTP(ck *model.Checkpoint, mf *modelFlags, refPath string, tol float64) error {
	ref, err := eval.LoadMTP(refPath)
	if err != nil {
		return err
	}
	e, err := newEngine(ck, mf, 2)
	if err != nil {
		return err
	}
	defer e.Close()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "case\ttrunk logits\ttrunk hidden\tmtp logits\tmtp hidden\tdraft logits\tdraft hidden\tchain logits\tchain hidden\tgreedy\tresult")
	failed := 0
	for i := range ref.Cases {
		r, err := eval.RunMTPCase(e, &ref.Cases[i], ref.Vocab, ref.Hidden)
		if err != nil {
			return fmt.Errorf("case %s: %w", ref.Cases[i].Name, err)
		}
		verdict := "ok"
		if !r.Pass(tol) {
			verdict = "FAIL"
			failed++
		}
		greedy := "match"
		if r.Mismatches > 0 {
			greedy = fmt.Sprintf("%d differ", r.Mismatches)
		}
		fmt.Fprintf(tw, "%s\t%.2e\t%.2e\t%.2e\t%.2e\t%.2e\t%.2e\t%.2e\t%.2e\t%s\t%s\n", r.Name, r.TrunkLogits, r.TrunkHidden,
			r.MTPLogits, r.MTPHidden, r.DraftLogits, r.DraftHidden, r.ChainLogits, r.ChainHidden, greedy, verdict)
	}
	tw.Flush()
	if failed > 0 {
		return fmt.Errorf("%d of %d MTP cases exceed --tol %g or change a greedy token", failed, len(ref.Cases), tol)
	}
	fmt.Printf("all %d MTP cases within %g, greedy tokens identical\n", len(ref.Cases), tol)
	return nil
}
