package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/serve"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/spf13/cobra"
)

func newServeCmd() *cobra.Command {
	var cfgPath, engineCfg string
	var sf serveFlags
	cmd := &cobra.Command{
		Use:   "serve [DIR | --model DIR | --preset NAME] [--host H] [--port P] [--http-port P] [--config FILE]",
		Short: "Serve the model over gRPC and an OpenAI-compatible HTTP API (continuous batching), with Prometheus metrics",
		Long: `Serve the model over gRPC (service glmflash.v1.GLMFlash, with health and reflection),
an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health)
and Prometheus metrics, until SIGINT or SIGTERM; then drain gracefully.

Configuration comes from, last wins: the built-in defaults (the preset ` + serve.DefaultPreset + `,
gRPC on 127.0.0.1:50051, HTTP on 127.0.0.1:8000, metrics on 127.0.0.1:9090), the YAML file
of --config, environment variables GLMFLASH_<SECTION>__<KEY> (e.g.
GLMFLASH_SERVER__HTTP_ADDR=0.0.0.0:8000), and the flags. The YAML file has the sections
model (name, dir | preset, seed, cache_dir, fp8; relative paths are relative to the file),
server (grpc_addr, http_addr, metrics_addr, drain_timeout) and runtime (slots,
max_running, max_queue, max_batch_tokens, prefill_chunk, context_limit,
default_max_tokens); unknown keys are errors.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := serve.LoadConfig(cfgPath, nil)
			if err != nil {
				return err
			}
			if err := sf.apply(cmd, args, &cfg); err != nil {
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
					fmt.Fprint(cmd.OutOrStdout(), banner(srv.Addr(), srv.MetricsAddr())+httpBanner(srv.HTTPAddr(), cfg.ServedName()))
				case <-ctx.Done():
				}
			}()
			return srv.Serve(ctx)
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "", "serving configuration (YAML; default: the built-in defaults)")
	sf.register(cmd)
	cmd.Flags().StringVar(&engineCfg, "engine-config", "", "engine YAML: which passes run (default: the built-in default, configs/engine.yaml)")
	return cmd
}

// serveFlags override the configuration (which the environment already
// overrode).
type serveFlags struct {
	model, preset, host string
	port, httpPort      int
}

func (f *serveFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.model, "model", "", "checkpoint directory (same as the DIR argument)")
	cmd.Flags().StringVar(&f.preset, "preset", "", "serve a random checkpoint of this preset ("+strings.Join(randckpt.PresetNames(), ", ")+")")
	cmd.Flags().StringVar(&f.host, "host", "", "host (interface) for the gRPC, HTTP and metrics listeners")
	cmd.Flags().IntVar(&f.port, "port", 0, "gRPC port")
	cmd.Flags().IntVar(&f.httpPort, "http-port", 0, "OpenAI-compatible HTTP port")
}

func (f *serveFlags) apply(cmd *cobra.Command, args []string, cfg *serve.Config) error {
	dir := f.model
	if len(args) == 1 {
		if f.model != "" && f.model != args[0] {
			return fmt.Errorf("the DIR argument (%s) and --model (%s) disagree", args[0], f.model)
		}
		dir = args[0]
	}
	switch {
	case dir != "" && f.preset != "":
		return fmt.Errorf("a checkpoint directory and --preset are mutually exclusive")
	case dir != "":
		cfg.Model.Dir, cfg.Model.Preset = dir, ""
	case f.preset != "":
		cfg.Model.Dir, cfg.Model.Preset = "", f.preset
	}
	setAddr := func(addr *string, flag string, port int) error {
		if *addr == "" && !cmd.Flags().Changed(flag) {
			return nil // disabled, and not asked for
		}
		host, p, err := net.SplitHostPort(*addr)
		if err != nil {
			host, p = "127.0.0.1", "0"
		}
		if f.host != "" {
			host = f.host
		}
		if cmd.Flags().Changed(flag) {
			if port < 0 || port > 65535 {
				return fmt.Errorf("--%s must be in [0, 65535], got %d", flag, port)
			}
			p = strconv.Itoa(port)
		}
		*addr = net.JoinHostPort(host, p)
		return nil
	}
	if err := setAddr(&cfg.Server.GRPCAddr, "port", f.port); err != nil {
		return err
	}
	if err := setAddr(&cfg.Server.HTTPAddr, "http-port", f.httpPort); err != nil {
		return err
	}
	if err := setAddr(&cfg.Server.MetricsAddr, "metrics-port-never-a-flag", 0); err != nil {
		return err
	}
	return cfg.Validate()
}

// httpBanner tells how to call the HTTP API.
func httpBanner(addr, model string) string {
	if addr == "" {
		return ""
	}
	return fmt.Sprintf("The OpenAI-compatible API is on http://%s/v1 (model %q). Stream a chat reply:\n"+
		"  curl -sN http://%s/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}],\"max_tokens\":24,\"stream\":true}'\n\n",
		addr, model, addr, model)
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
