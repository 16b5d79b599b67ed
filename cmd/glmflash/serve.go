package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/serve"
	"github.com/spf13/cobra"
)

func newServeCmd() *cobra.Command {
	var cfgPath, engineCfg string
	cmd := &cobra.Command{
		Use:   "serve --config FILE",
		Short: "Serve the model over gRPC (streaming generation with continuous batching) and Prometheus metrics",
		Long: `Serve the model over gRPC (service glmflash.v1.GLMFlash, with health and reflection)
and Prometheus metrics over HTTP, until SIGINT or SIGTERM; then drain gracefully.

The YAML file has the sections model (dir | preset, seed, cache_dir, fp8), server
(grpc_addr, metrics_addr, drain_timeout) and runtime (slots, max_running, max_queue,
max_batch_tokens, prefill_chunk, context_limit, default_max_tokens); unknown keys are
errors. Environment variables GLMFLASH_<SECTION>__<KEY> override it, e.g.
GLMFLASH_SERVER__GRPC_ADDR=127.0.0.1:6000.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := serve.LoadConfig(cfgPath, nil)
			if err != nil {
				return err
			}
			mf := modelFlags{dir: cfg.Model.Dir, preset: cfg.Model.Preset, seed: cfg.Model.Seed, cacheDir: cfg.Model.CacheDir, fp8: cfg.Model.FP8}
			if mf.cacheDir == "" {
				mf.cacheDir = defaultCacheDir()
			}
			source := mf.dir
			if mf.preset != "" {
				source = fmt.Sprintf("preset %s (seed %d)", mf.preset, mf.seed)
			}
			exitOnSignal = false // drain first; main stops plugin processes at exit
			ec, err := engineConfig(engineCfg)
			if err != nil {
				return err
			}
			var pipeline *pass.Pipeline
			var env *pass.Env
			srv, err := serve.New(cfg, serve.Options{
				Log: log,
				Load: func(context.Context) (*serve.LoadedModel, error) {
					ck, err := mf.open()
					if err != nil {
						return nil, err
					}
					if pipeline, env, err = pipelineFor(ec, ck); err != nil {
						ck.Close()
						return nil, err
					}
					tm, err := mf.textModel(ck.Config().VocabSize)
					if err != nil {
						ck.Close()
						return nil, err
					}
					return &serve.LoadedModel{Config: ck.Config(), Weights: ck, Source: source, Close: ck.Close, Text: tm}, nil
				},
				Engine: func(o *engine.Options) { o.Passes, o.PassEnv = pipeline, env },
				PassReport: func(e *engine.Engine) any {
					out := map[string]*pass.Report{}
					for k, r := range e.Reports() {
						out[k.String()] = r
					}
					return map[string]any{"config": ec.Source, "programs": out}
				},
			})
			if err != nil {
				return err
			}
			if err := srv.Listen(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			go func() {
				select {
				case <-srv.Ready():
					fmt.Fprint(cmd.OutOrStdout(), banner(srv.Addr(), srv.MetricsAddr()))
				case <-ctx.Done():
				}
			}()
			return srv.Serve(ctx)
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "configs/serve.yaml", "serving configuration (YAML)")
	cmd.Flags().StringVar(&engineCfg, "engine-config", "", "engine YAML: which passes run (default: the built-in default, configs/engine.yaml)")
	return cmd
}

// banner tells how to call the server once it is ready.
func banner(addr, metrics string) string {
	s := fmt.Sprintf("\nglmflash is serving glmflash.v1.GLMFlash on %s (Ctrl-C drains and stops).\nTry:\n", addr)
	s += fmt.Sprintf("  bin/grpcurl -plaintext -d '{\"prompt_ids\":[1,2,3,4,5,6,7,8],\"max_tokens\":16,\"sampling\":{\"temperature\":0}}' %s glmflash.v1.GLMFlash/Generate\n", addr)
	s += fmt.Sprintf("  bin/grpcurl -plaintext %s glmflash.v1.GLMFlash/GetModelInfo\n", addr)
	s += fmt.Sprintf("  bin/grpcurl -plaintext %s grpc.health.v1.Health/Check\n", addr)
	if metrics != "" {
		s += fmt.Sprintf("  curl -s http://%s/metrics | grep ^glmflash_\n", metrics)
	}
	return s + "\n"
}
