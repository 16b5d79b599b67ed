package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/glmflash/glmflash/core/attrib"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/passes/autotune"
	"github.com/glmflash/glmflash/plugins/host"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// gitCommit is the commit the binary was built from (Go's VCS stamp, or
// the Makefile's -X main.revision), else the checkout's short commit, else
// "unknown". The binary's own stamp comes first: a binary carried to
// another machine runs in a working tree whose git state may be another.
func gitCommit() string {
	if rev, _, modified := buildRevision(); rev != "" {
		if modified {
			return rev[:min(7, len(rev))] + "-dirty"
		}
		return rev[:min(7, len(rev))]
	}
	if revision != "" {
		return revision
	}
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		c += "-dirty"
	}
	return c
}

func newAttributeCmd() *cobra.Command {
	var studyPath, outDir string
	var quiet bool
	var mf modelFlags
	cmd := &cobra.Command{
		Use:   "attribute --study FILE.yaml",
		Args:  cobra.NoArgs,
		Short: "Run an attribution study: which pass buys how much, on which workload, with parity on every arm",
		RunE: func(cmd *cobra.Command, args []string) error {
			if studyPath == "" {
				return fmt.Errorf("--study is required")
			}
			base, err := mf.config()
			if err != nil {
				return err
			}
			exitOnSignal = false // the first signal stops the study, a second forces the exit
			ctx, stop := withSignals(cmd.Context())
			defer stop()
			st, err := loadStudy(studyPath)
			if err != nil {
				return err
			}
			// a study records what it runs on: its device settings win, and
			// a flag that says otherwise is an error, not an override
			if f := cmd.Flags().Lookup("device"); f != nil && f.Changed && st.Device != "" && f.Value.String() != st.Device {
				return fmt.Errorf("--device %s: the study %s says device: %s", f.Value.String(), studyPath, st.Device)
			}
			base = st.ApplyEngine(base)
			dev := base.Device
			// the destination is checked (and a staging folder made) before
			// anything is loaded or measured
			if outDir == "" {
				outDir = st.OutputDir
			}
			if outDir == "" {
				outDir = filepath.Join("out", "studies", st.Name+"-"+time.Now().Format("20060102-150405"))
			}
			dest, err := attrib.PrepareOutput(outDir)
			if err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			defer dest.Abort()
			// the study names the model; the configuration says where
			// presets are cached
			mc := config.Model{Dir: st.Model.Dir, Preset: st.Model.Preset, Seed: st.Model.Seed, FP8: st.Model.FP8, Set: st.Model.Set, CacheDir: base.Model.CacheDir}
			if mc.Seed == 0 {
				mc.Seed = 1
			}
			ck, err := openModel(mc)
			if err != nil {
				return err
			}
			defer ck.Close()
			if err := st.CheckModel(ck.Config().VocabSize, ck.Config().MaxPositionEmbeddings); err != nil {
				return err
			}
			var runner attrib.Runner
			pf := func(ec *config.Config) (*pass.Pipeline, error) { return pipelineWithPlugins(ec) }
			switch st.Level {
			case attrib.LevelEngine:
				er := attrib.NewEngineRunner(st, ck.Config(), ck, ck, pf)
				er.Base = base
				runner = er
			case attrib.LevelServing:
				sr, err := newServingRunner(st, ck.Dir(), dev, mf.files)
				if err != nil {
					return err
				}
				runner = sr
			}
			defer runner.Close()
			prov := attrib.Provenance{Commit: gitCommit(), CPU: autotune.CPUModel(), CPUs: runtime.NumCPU(), Date: time.Now().UTC().Format(time.RFC3339),
				GoVersion: runtime.Version(), Model: ck.Dir()}
			arms, _ := st.Expand()
			log.Info().Str("study", st.Name).Str("study_level", st.Level).Int("arms", len(arms)).Int("cells", len(st.Cells())).
				Int("rounds", st.Repetitions).Int("warmup", st.Warmup).Msg("starting study")
			var bar *progressbar.ProgressBar
			progress := func(done, total int, label string) {
				if quiet {
					return
				}
				if term.IsTerminal(int(os.Stderr.Fd())) {
					if bar == nil {
						bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionShowCount(),
							progressbar.OptionSetElapsedTime(true), progressbar.OptionSetPredictTime(true), progressbar.OptionSetWidth(30))
					}
					bar.Describe(label)
					bar.Set(done)
					return
				}
				log.Info().Int("done", done).Int("of", total).Str("at", label).Msg("progress")
			}
			t0 := time.Now()
			res, err := attrib.Run(ctx, st, attrib.Options{Runner: runner, Vocab: ck.Config().VocabSize, Provenance: prov, Progress: progress})
			if bar != nil {
				bar.Finish()
				fmt.Fprintln(os.Stderr)
			}
			if err != nil {
				return fmt.Errorf("study %s: %w (nothing was written)", st.Name, err)
			}
			files, sum, err := dest.Commit(res)
			if err != nil {
				return err
			}
			res.Console(os.Stdout, sum)
			fmt.Printf("\nwall time %s; wrote %s\n", time.Since(t0).Round(time.Second), strings.Join(files, ", "))
			if sum.ParityTotal > 0 && st.Parity != attrib.ParityReport {
				return fmt.Errorf("parity failure: %d requests differ from baseline", sum.ParityTotal)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&studyPath, "study", "", "study YAML (see configs/studies/)")
	cmd.Flags().StringVar(&outDir, "out", "", "output directory (default: the study's output_dir, else out/studies/NAME-TIME)")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no progress output")
	mf.addConfig(cmd)
	mf.addDevice(cmd)
	return cmd
}

// loadStudy parses a study, knowing built-in pass names and the names of
// the plugin passes found in the study's plugins.dir (discovered, verified
// and described before anything runs).
func loadStudy(path string) (*attrib.Study, error) {
	plugins := map[string]bool{}
	if pre, err := attrib.Load(path, func(string) bool { return true }); err == nil && pre.Plugins.Dir != "" {
		h, err := host.Open(host.OptionsFromConfig(&config.Config{Plugins: pre.Plugins}, log))
		if err != nil {
			return nil, fmt.Errorf("%s: plugins: %w", path, err)
		}
		for _, n := range h.Names() {
			plugins[n] = true
		}
		h.Close()
	}
	return attrib.Load(path, func(name string) bool {
		_, ok := pass.Lookup(name)
		return ok || plugins[name]
	})
}
