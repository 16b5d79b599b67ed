package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/serve"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/spf13/cobra"
)

func newServeCmd() *cobra.Command {
	var mf modelFlags
	var sf serveFlags
	cmd := &cobra.Command{
		Use:   "serve [DIR | --model DIR | --preset NAME] [--host H] [--port P] [--http-port P] [--metrics-port P] [--config FILE]",
		Short: "Serve the model over gRPC and an OpenAI-compatible HTTP API (continuous batching), with Prometheus metrics",
		Long: `Serve the model over gRPC (service glmflash.v1.GLMFlash, with health and reflection),
an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health)
and Prometheus metrics, until SIGINT or SIGTERM; then drain gracefully.

Configuration comes from, last wins: the built-in defaults (configs/engine.yaml and
configs/serve.yaml: every pass on, the preset small, gRPC on 127.0.0.1:50051, HTTP on
127.0.0.1:8000 with /metrics, no metrics port of its own), the YAML files of --config, environment
variables GLMFLASH_<SECTION>__<KEY> (e.g. GLMFLASH_SERVER__HTTP_ADDR=0.0.0.0:8000), and
the flags. The file has the engine sections (device, passes, parallel, lora, debug,
plugins) and the serving sections model (name, dir | preset, seed, cache_dir, fp8,
check_tensors, load_format auto | dummy, set; --load-format dummy serves random weights made
in memory, --set FIELD=VALUE scales the config), server (grpc_addr, http_addr, metrics_addr, drain_timeout,
max_response_bytes, max_request_bytes, tls, auth, reflection, keepalive and connection
age, expose_paths), runtime (slots, max_running, max_queue, max_batch_tokens,
prefill_chunk, context_limit, default_max_tokens) and speculative (method off | mtp,
preset 5-1-6 | 1-1-2, num_steps, index_share; --speculative mtp:5 sets them); relative
paths in it are relative to the file, and unknown keys are errors. TLS and API keys apply
to gRPC and HTTP alike.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := sf.apply(cmd, args, &mf); err != nil {
				return err
			}
			cfg, err := mf.config()
			if err != nil {
				return err
			}
			exitOnSignal = false // drain first; main stops plugin processes at exit
			ctx, stop := withSignals(cmd.Context())
			defer stop()
			// the pipeline (and its plugins) before anything listens: a bad
			// engine configuration is an error at once
			pipeline, err := pipelineWithPlugins(cfg)
			if err != nil {
				return fmt.Errorf("%s: %w", cfg.Source, err)
			}
			if ctx.Err() != nil {
				return nil // stopped while plugins started
			}
			srv, err := serve.New(cfg, serve.Options{
				Log: log,
				Load: func(context.Context) (*serve.LoadedModel, error) {
					ck, err := mf.open()
					if err != nil {
						return nil, err
					}
					if err := fillDummy(cfg.Device, ck); err != nil {
						ck.Close()
						return nil, err
					}
					tm, err := mf.textModel(ck.Config().VocabSize)
					if err != nil {
						ck.Close()
						return nil, err
					}
					tm.SpecialTokensInContent = cfg.Model.SpecialTokensInContent
					tm.ToolCallParser, tm.ReasoningParser = cfg.Model.ToolCallParser, cfg.Model.ReasoningParser
					return &serve.LoadedModel{Config: ck.Config(), Weights: ck, Info: ck, Source: source(cfg.Model), Close: ck.Close, Text: tm}, nil
				},
				Passes: pipeline,
				PassReport: func(e *engine.Engine) any {
					out := map[string]*pass.Report{}
					for k, r := range e.Reports() {
						out[k.String()] = r
					}
					return map[string]any{"config": cfg.Source, "programs": out}
				},
			})
			if err != nil {
				return err
			}
			if err := srv.Listen(); err != nil {
				return err
			}
			go func() {
				select {
				case <-srv.Ready():
					keys := cfg.Server.Auth.APIKeysFile != ""
					fmt.Fprint(cmd.OutOrStdout(), banner(srv.Addr(), srv.MetricsAddr(), cfg.Server.TLS.Enabled(), keys)+
						httpBanner(srv.HTTPAddr(), cfg.ServedName(), cfg.Server.TLS.Enabled(), keys))
				case <-ctx.Done():
				}
			}()
			return srv.Serve(ctx)
		},
	}
	mf.addConfig(cmd)
	mf.addDevice(cmd)
	mf.addPrecision(cmd)
	mf.addSpeculative(cmd)
	mf.addLoad(cmd, true)
	sf.register(cmd)
	return cmd
}

// serveFlags set keys of the model and server sections: the checkpoint
// (DIR, --model, --preset) and the listeners (--host, --port, --http-port,
// --metrics-port).
type serveFlags struct {
	model, preset, host         string
	port, httpPort, metricsPort int
}

func (f *serveFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.model, "model", "", "checkpoint directory (same as the DIR argument)")
	cmd.Flags().StringVar(&f.preset, "preset", "", "serve a random checkpoint of this preset ("+strings.Join(randckpt.PresetNames(), ", ")+")")
	cmd.Flags().StringVar(&f.host, "host", "", "host (interface) for the gRPC, HTTP and metrics listeners")
	cmd.Flags().IntVar(&f.port, "port", 0, "gRPC port")
	cmd.Flags().IntVar(&f.httpPort, "http-port", 0, "OpenAI-compatible HTTP port")
	cmd.Flags().IntVar(&f.metricsPort, "metrics-port", 0, "Prometheus /metrics port (server.metrics_addr; /metrics is on the HTTP port too with server.http_metrics)")
}

// apply turns the flags into configuration keys (mf.extra). The addresses
// combine the configured ones with --host and the ports, so they are
// computed from the configuration without these flags.
func (f *serveFlags) apply(cmd *cobra.Command, args []string, mf *modelFlags) error {
	dir := f.model
	if len(args) == 1 {
		if f.model != "" && f.model != args[0] {
			return fmt.Errorf("the DIR argument (%s) and --model (%s) disagree", args[0], f.model)
		}
		dir = args[0]
	}
	var keys []config.Flag
	switch {
	case dir != "" && f.preset != "":
		return fmt.Errorf("a checkpoint directory and --preset are mutually exclusive")
	case dir != "":
		keys = append(keys, config.Flag{Key: "model.dir", Value: dir, Name: "--model (or DIR)"})
	case f.preset != "":
		keys = append(keys, config.Flag{Key: "model.preset", Value: f.preset, Name: "--preset"})
	}
	base, err := mf.config()
	if err != nil {
		return err
	}
	setAddr := func(addr, key, flag string, port int) error {
		if addr == "" && !cmd.Flags().Changed(flag) {
			return nil // disabled, and not asked for
		}
		if f.host == "" && !cmd.Flags().Changed(flag) {
			return nil
		}
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			host, p = "127.0.0.1", "0"
		}
		if f.host != "" {
			host = f.host
		}
		name := "--host"
		if cmd.Flags().Changed(flag) {
			if port < 0 || port > 65535 {
				return fmt.Errorf("--%s must be in [0, 65535], got %d", flag, port)
			}
			p, name = strconv.Itoa(port), "--"+flag
		}
		keys = append(keys, config.Flag{Key: key, Value: net.JoinHostPort(host, p), Name: name})
		return nil
	}
	if err := setAddr(base.Server.GRPCAddr, "server.grpc_addr", "port", f.port); err != nil {
		return err
	}
	if err := setAddr(base.Server.HTTPAddr, "server.http_addr", "http-port", f.httpPort); err != nil {
		return err
	}
	if err := setAddr(base.Server.MetricsAddr, "server.metrics_addr", "metrics-port", f.metricsPort); err != nil {
		return err
	}
	mf.extra, mf.cfg = keys, nil // load again with them
	return nil
}

// httpBanner tells how to call the HTTP API (over TLS and with a key when
// the server wants them).
func httpBanner(addr, model string, tls, keys bool) string {
	if addr == "" {
		return ""
	}
	scheme, flags := "http", ""
	if tls {
		scheme, flags = "https", " --cacert CA.pem" // and --cert/--key with mutual TLS
	}
	if keys {
		flags += ` -H "Authorization: Bearer $KEY"`
	}
	return fmt.Sprintf("The OpenAI-compatible API is on %s://%s/v1 (model %q). Stream a chat reply:\n"+
		"  curl -sN%s %s://%s/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}],\"max_tokens\":24,\"stream\":true}'\n\n",
		scheme, addr, model, flags, scheme, addr, model)
}

// banner tells how to call the server once it is ready.
func banner(addr, metrics string, tls, keys bool) string {
	s := fmt.Sprintf("\nglmflash is serving glmflash.v1.GLMFlash on %s (Ctrl-C drains and stops, a second Ctrl-C forces).\nTry:\n", addr)
	flags := "-plaintext"
	if tls {
		flags = "-cacert CA.pem" // and -cert/-key with mutual TLS
	}
	if keys {
		flags += ` -H "authorization: Bearer $KEY"`
	}
	s += fmt.Sprintf("  bin/grpcurl %s -d '{\"prompt_ids\":[1,2,3,4,5,6,7,8],\"max_tokens\":16,\"sampling\":{\"temperature\":0}}' %s glmflash.v1.GLMFlash/Generate\n", flags, addr)
	s += fmt.Sprintf("  bin/grpcurl %s %s glmflash.v1.GLMFlash/GetModelInfo\n", flags, addr)
	s += fmt.Sprintf("  bin/grpcurl %s %s grpc.health.v1.Health/Check\n", flags, addr)
	if metrics != "" {
		s += fmt.Sprintf("  curl -s http://%s/metrics | grep ^glmflash_\n", metrics)
	}
	return s + "\n"
}
