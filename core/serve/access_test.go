package serve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/access"
	"github.com/glmflash/glmflash/core/backend/cpu"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/internal/testcert"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

func tlsClient(t *testing.T, addr string, f testcert.Files, cert, key string) *grpc.ClientConn {
	t.Helper()
	pem, err := os.ReadFile(f.CA)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(pem))
	c := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		require.NoError(t, err)
		c.Certificates = []tls.Certificate{kp}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(c)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TLS and mutual TLS: plaintext clients are refused; with client_ca_file a
// client must present a certificate of that CA.
func TestTLSAndMutualTLS(t *testing.T) {
	f := testcert.Write(t.TempDir())
	h := start(t, setup{cfg: func(c *config.Config) {
		c.Server.TLS.CertFile, c.Server.TLS.KeyFile = f.ServerCert, f.ServerKey
	}})
	info := func(conn *grpc.ClientConn) error {
		_, err := pb.NewGLMFlashClient(conn).GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
		return err
	}
	require.Error(t, info(h.conn), "a plaintext client cannot talk to a TLS server")
	require.NoError(t, info(tlsClient(t, h.srv.Addr(), f, "", "")))
	h.shutdown(t)

	m := start(t, setup{cfg: func(c *config.Config) {
		c.Server.TLS = accessTLS(f.ServerCert, f.ServerKey, f.CA)
	}})
	require.Error(t, info(tlsClient(t, m.srv.Addr(), f, "", "")), "no client certificate")
	require.Error(t, info(tlsClient(t, m.srv.Addr(), f, f.OtherClientCert, f.OtherClientKey)), "a certificate of another CA")
	require.NoError(t, info(tlsClient(t, m.srv.Addr(), f, f.ClientCert, f.ClientKey)))
}

func keyFile(t *testing.T, keys ...string) string {
	p := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(p, []byte(strings.Join(keys, "\n")+"\n"), 0o600))
	return p
}

func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
}

// API keys: every call but health checks needs one; Abort works only for
// the key that started the request, or an admin key.
func TestAPIKeysAndAbortOwnership(t *testing.T) {
	alice, bob, admin := "alice-key-0123456789", "bob-key-0123456789ab", "admin-key-0123456789"
	h := start(t, setup{cfg: func(c *config.Config) {
		c.Server.Auth.APIKeysFile = keyFile(t, alice, bob)
		c.Server.Auth.AdminKeysFile = keyFile(t, admin)
	}})
	_, err := h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	_, err = h.client.GetModelInfo(withKey("wrong-key-0123456789"), &pb.GetModelInfoRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	_, err = generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: prompt(3, 1), MaxTokens: ptr(uint32(2))})
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	_, err = h.client.GetModelInfo(withKey(alice), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	// x-api-key works too
	_, err = h.client.GetModelInfo(metadata.AppendToOutgoingContext(context.Background(), "x-api-key", bob), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	hc, err := healthpb.NewHealthClient(h.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "health checks need no key")
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, hc.Status)

	open := func(id string) grpc.ServerStreamingClient[pb.GenerateResponse] {
		st, err := h.client.Generate(withKey(alice), &pb.GenerateRequest{RequestId: id, PromptIds: prompt(4, 1), MaxTokens: ptr(uint32(4000)), Sampling: greedy()})
		require.NoError(t, err)
		_, err = st.Recv()
		require.NoError(t, err)
		return st
	}
	finish := func(st grpc.ServerStreamingClient[pb.GenerateResponse]) *pb.Finish {
		for {
			m, err := st.Recv()
			if err == io.EOF {
				return nil
			}
			require.NoError(t, err)
			if f := m.GetFinish(); f != nil {
				return f
			}
		}
	}
	st := open("alices")
	_, err = h.client.Abort(withKey(bob), &pb.AbortRequest{RequestId: "alices"})
	require.Equal(t, codes.NotFound, status.Code(err), "another caller cannot abort (or see) it")
	_, err = h.client.Abort(withKey(alice), &pb.AbortRequest{RequestId: "alices"})
	require.NoError(t, err)
	require.Equal(t, pb.FinishReason_FINISH_REASON_ABORT, finish(st).Reason)
	st = open("alices-2")
	_, err = h.client.Abort(withKey(admin), &pb.AbortRequest{RequestId: "alices-2"})
	require.NoError(t, err, "an admin key may abort anyone's")
	require.Equal(t, pb.FinishReason_FINISH_REASON_ABORT, finish(st).Reason)
	require.Equal(t, 3.0, scrapeWith(t, h.srv, `glmflash_requests_total{status="unauthenticated"}`, admin))
}

// Reflection can be switched off.
func TestReflectionSwitch(t *testing.T) {
	h := start(t, setup{cfg: func(c *config.Config) { c.Server.Reflection = false }})
	rc, err := reflectionpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(context.Background())
	require.NoError(t, err)
	_ = rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}) // io.EOF once the server refused
	_, err = rc.Recv()
	require.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)
}

// GetModelInfo keeps absolute paths to itself unless server.expose_paths.
func TestModelInfoHidesPaths(t *testing.T) {
	abs, err := filepath.Abs(fixture)
	require.NoError(t, err)
	report := map[string]any{"config": "/etc/glmflash/engine.yaml", "error": "SHA-256 of /opt/plugins/glmflash-pass-x is 00"}
	opts := func(o *Options) {
		o.PassReport = func(*engineT) any { return report }
		load := o.Load
		o.Load = func(ctx context.Context) (*LoadedModel, error) {
			lm, err := load(ctx)
			if lm != nil {
				lm.Source = abs
			}
			return lm, err
		}
	}
	h := start(t, setup{opts: opts})
	mi, err := h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	require.Equal(t, "…/checkpoint", mi.Model.Source)
	require.NotContains(t, mi.PassReportJson, "/etc/glmflash")
	require.Contains(t, mi.PassReportJson, `"config":"…/engine.yaml"`)
	require.Contains(t, mi.PassReportJson, "SHA-256 of …/glmflash-pass-x is 00")
	h.shutdown(t)
	h = start(t, setup{opts: opts, cfg: func(c *config.Config) { c.Server.ExposePaths = true }})
	mi, err = h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	require.Equal(t, abs, mi.Model.Source)
}

type engineT = engine.Engine

func accessTLS(cert, key, ca string) access.TLS {
	return access.TLS{CertFile: cert, KeyFile: key, ClientCAFile: ca}
}

// The memory planner sizes the caches from the host's available memory
// (cpu.Meminfo) after the weights: GetModelInfo, the log and the metrics
// say what it planned and what binds; a memory too small for one sequence
// at the context limit is refused at load, naming the keys to change.
func TestMemoryPlanAtLoad(t *testing.T) {
	old := cpu.Meminfo
	t.Cleanup(func() { cpu.Meminfo = old })
	meminfo := func(kb int) { // MemAvailable
		cpu.Meminfo = func() ([]byte, error) {
			return fmt.Appendf(nil, "MemTotal: %d kB\nMemAvailable: %d kB\n", 2*kb, kb), nil
		}
	}
	meminfo(1 << 20)                                    // 1 GiB: the default bound of 8 sequences binds
	h := start(t, setup{rt: config.Runtime{Slots: -1}}) // -1: the planner's (start sets 0 to 8)
	info, err := h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	m := info.Engine.Memory
	require.NotNil(t, m)
	require.Equal(t, uint64(1<<30), m.FreeBytes)
	require.Equal(t, 0.5, m.MemoryFraction)
	require.LessOrEqual(t, m.PlannedBytes, m.BudgetBytes)
	require.LessOrEqual(t, float64(m.BudgetBytes), 0.5*float64(m.FreeBytes))
	require.Equal(t, "default_slots", m.Binding)
	require.Equal(t, uint32(8), m.StateSlots)
	require.Equal(t, uint32(8), info.Engine.Slots)
	require.Equal(t, uint32(8*64), m.KvPages, "every slot can reach the context limit: 4096 tokens in pages of 64")
	require.Equal(t, 8.0, scrape(t, h.srv, "glmflash_max_running"))
	require.Equal(t, 512.0, scrapeLabeled(t, h.srv, "glmflash_kv_pages", "free"))
	require.Equal(t, 0.0, scrapeLabeled(t, h.srv, "glmflash_kv_pages", "used"))
	require.Equal(t, 8.0, scrapeLabeled(t, h.srv, "glmflash_state_slots", "free"))
	require.Equal(t, 0.0, scrape(t, h.srv, "glmflash_preemptions_total"))
	h.shutdown(t)

	// 8 MB at a fraction of 0.5: fewer pages than 3 slots at 4096 tokens
	meminfo(8 << 10)
	h = start(t, setup{rt: config.Runtime{Slots: 3, MemoryFraction: 0.5}})
	info, err = h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	m = info.Engine.Memory
	require.Equal(t, "pages", m.Binding)
	require.Less(t, m.ContextSequences, m.StateSlots)
	require.LessOrEqual(t, m.PlannedBytes, m.BudgetBytes)
	h.shutdown(t)

	// 1 MB: not one sequence of 4096 tokens
	meminfo(1 << 10)
	cfg := config.Default()
	cfg.Model.Dir, cfg.Model.Preset = fixture, ""
	cfg.Server.GRPCAddr = "127.0.0.1:0"
	srv, err := New(cfg, Options{Load: fixtureLoader(nil)})
	require.NoError(t, err)
	err = srv.load(context.Background())
	require.ErrorContains(t, err, "not enough memory: one sequence of runtime.context_limit 4096 tokens")
	require.ErrorContains(t, err, "runtime.memory_fraction")
}
