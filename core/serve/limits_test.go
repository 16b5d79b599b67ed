package serve

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/internal/testcert"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// alive counts the connections the server has not closed.
func alive(conns []net.Conn) int {
	n := 0
	buf := make([]byte, 4096)
	for _, c := range conns {
		for { // read what the server sent (a response) until it is quiet or gone
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			_, err := c.Read(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				n++
				break
			}
			if err != nil {
				break
			}
		}
	}
	return n
}

func get(t *testing.T, url string) (int, error) {
	t.Helper()
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// A flood of idle connections (silent ones, and keep-alive ones after a
// request) cannot take a bounded server's descriptors: the listener holds
// at most server.max_connections_per_client of one client, closing the
// oldest idle one to make room, so /health, metrics and gRPC health go on
// answering; idle keep-alive connections close after server.idle_timeout.
func TestIdleConnectionFloodKeepsHealthAnswering(t *testing.T) {
	const perClient = 16
	h := start(t, setup{cfg: func(c *config.Config) {
		c.Server.MaxConnections, c.Server.MaxConnectionsPerClient = 4*perClient, perClient
		c.Server.IdleTimeout = 2 * time.Second
		c.Server.ReadHeaderTimeout = 30 * time.Second // the silent ones are not closed by the header timeout here
	}})
	var flood []net.Conn
	t.Cleanup(func() {
		for _, c := range flood {
			c.Close()
		}
	})
	for _, addr := range []string{h.srv.HTTPAddr(), h.srv.MetricsAddr()} {
		for i := 0; i < 10*perClient; i++ {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			flood = append(flood, c)
			if i%2 == 0 { // a keep-alive connection left idle after one request
				fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
			}
		}
	}
	time.Sleep(200 * time.Millisecond)
	for i := 0; i < 20; i++ {
		code, err := get(t, "http://"+h.srv.HTTPAddr()+"/health")
		require.NoError(t, err, "round %d", i)
		require.Equal(t, 200, code)
		code, err = get(t, "http://"+h.srv.MetricsAddr()+"/metrics")
		require.NoError(t, err, "round %d", i)
		require.Equal(t, 200, code)
	}
	hc, err := healthpb.NewHealthClient(h.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, hc.Status)
	require.LessOrEqual(t, alive(flood), 2*perClient, "at most max_connections_per_client of the flood stay open on each listener")

	// The gRPC listener refuses connections over the bound (it cannot
	// tell an idle one), and closes the silent ones at the handshake timeout.
	var gflood []net.Conn
	for i := 0; i < 2*perClient; i++ {
		c, err := net.Dial("tcp", h.srv.Addr())
		require.NoError(t, err)
		gflood = append(gflood, c)
	}
	flood = append(flood, gflood...)
	time.Sleep(200 * time.Millisecond)
	require.LessOrEqual(t, alive(gflood), perClient)
	hc, err = healthpb.NewHealthClient(h.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "an established gRPC connection is not disturbed")
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, hc.Status)

	// Idle keep-alive connections close after idle_timeout.
	c, err := net.Dial("tcp", h.srv.HTTPAddr())
	require.NoError(t, err)
	defer c.Close()
	fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	t0 := time.Now()
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the server closed the idle connection")
	require.Less(t, time.Since(t0), 5*time.Second)
}

// A body trickled a byte at a time is refused (408) once it falls behind
// server.body_timeout + its size at server.min_body_rate, and its
// connection closed; it is not held forever.
func TestTrickledBodyIsCut(t *testing.T) {
	h := start(t, setup{cfg: func(c *config.Config) {
		c.Server.BodyTimeout, c.Server.MinBodyRate = 500*time.Millisecond, 100
	}})
	c, err := net.Dial("tcp", h.srv.HTTPAddr())
	require.NoError(t, err)
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	done := make(chan struct{})
	defer close(done)
	go func() { // a byte every 200 ms: 5 bytes/s, under the 100 bytes/s asked
		for {
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	t0 := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "no answer: the trickled body is held")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 408, resp.StatusCode, string(b))
	require.Contains(t, string(b), "server.min_body_rate")
	require.Less(t, time.Since(t0), 3*time.Second)

	// A body that arrives at a fair rate is fine, even slower than at once.
	c2, err := net.Dial("tcp", h.srv.HTTPAddr())
	require.NoError(t, err)
	defer c2.Close()
	body := `{"prompt":[1,2,3],"max_tokens":2}`
	fmt.Fprintf(c2, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	for i := 0; i < len(body); i += 8 {
		time.Sleep(20 * time.Millisecond)
		_, _ = c2.Write([]byte(body[i:min(i+8, len(body))])) // the server may cut it meanwhile
	}
	require.NoError(t, c2.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err = http.ReadResponse(bufio.NewReader(c2), nil)
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, string(b))
}

// smallSendBuffers makes the accepted connections' send buffers small, so
// that a client that stops reading stalls the server's writes at once.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	nc := c
	for {
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetWriteBuffer(4096)
			break
		}
		u, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		nc = u.NetConn()
	}
	return c, nil
}

// An SSE reader that stops reading does not keep its handler (nor its cache
// slot): the write that cannot go out within server.write_timeout ends the
// stream and aborts the request, long before it would have finished.
func TestStalledSSEReaderReleasesItsHandler(t *testing.T) {
	h := start(t, setup{rt: config.Runtime{Slots: 2, DefaultMaxTokens: 16}, opts: withText(t), cfg: func(c *config.Config) {
		c.Server.WriteTimeout = 300 * time.Millisecond
	}, listened: func(s *Server) { s.alis = smallSendBuffers{s.alis} }})
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048) })
	}}
	c, err := d.Dial("tcp", h.srv.HTTPAddr())
	require.NoError(t, err)
	defer c.Close()
	body := `{"prompt":[1,2,3],"max_tokens":4000,"stream":true,"temperature":0,"ignore_eos":true}`
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	head := make([]byte, 256)
	_, err = io.ReadFull(c, head) // the headers and a first event; then the client reads no more
	require.NoError(t, err)
	require.Contains(t, string(head), "200 OK")
	rt := h.srv.Runtime()
	deadline := time.Now().Add(20 * time.Second)
	for {
		w, r := rt.InFlight()
		if w+r == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the stalled stream still holds its request")
		time.Sleep(50 * time.Millisecond)
	}
	require.Less(t, scrape(t, h.srv, "glmflash_generated_tokens_total"), 4000.0, "ended early, not run to its length")
	// Reading again, the client finds the stream cut: no [DONE], the
	// connection closed.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	rest, err := io.ReadAll(c)
	require.NoError(t, err, "the server closed the connection")
	require.NotContains(t, string(rest), "[DONE]")
}

// A foreign Host (DNS rebinding), a foreign Origin and a body that is not
// JSON are refused before any work; allowed origins get CORS headers.
func TestHostOriginAndContentType(t *testing.T) {
	h := start(t, setup{})
	base := "http://" + h.srv.HTTPAddr()
	do := func(method, url, ctype, host, origin, body string) (*http.Response, string) {
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		require.NoError(t, err)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if host != "" {
			req.Host = host
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	body := `{"prompt":[1,2,3],"max_tokens":2}`
	resp, b := do("POST", base+"/v1/completions", "text/plain", "", "", body)
	require.Equal(t, 415, resp.StatusCode, b)
	require.Contains(t, b, `"param":"Content-Type"`)
	resp, b = do("POST", base+"/v1/chat/completions", "", "", "", `{"messages":[{"role":"user","content":"x"}]}`)
	require.Equal(t, 415, resp.StatusCode, b)
	resp, b = do("POST", base+"/v1/completions", "application/json", "evil.example:8000", "", body)
	require.Equal(t, 421, resp.StatusCode, b)
	require.Contains(t, b, "server.allowed_hosts")
	resp, _ = do("GET", base+"/health", "", "evil.example", "", "")
	require.Equal(t, 421, resp.StatusCode)
	resp, _ = do("GET", "http://"+h.srv.MetricsAddr()+"/metrics", "", "evil.example", "", "")
	require.Equal(t, 421, resp.StatusCode, "metrics check the Host too")
	resp, b = do("POST", base+"/v1/completions", "application/json", "", "http://evil.example", body)
	require.Equal(t, 403, resp.StatusCode, b)
	require.Contains(t, b, "server.allowed_origins")
	require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"), "CORS is off")
	for _, host := range []string{"localhost:8000", "127.0.0.1", "[::1]:8000", "api.localhost"} {
		resp, b = do("POST", base+"/v1/completions", "application/json; charset=utf-8", host, "", body)
		require.Equal(t, 200, resp.StatusCode, "%s: %s", host, b)
	}

	// Configured hosts and origins.
	h2 := start(t, setup{cfg: func(c *config.Config) {
		c.Server.AllowedHosts = []string{"api.example", "*.internal"}
		c.Server.AllowedOrigins = []string{"https://app.example"}
	}})
	base = "http://" + h2.srv.HTTPAddr()
	resp, _ = do("GET", base+"/health", "", "127.0.0.1", "", "")
	require.Equal(t, 421, resp.StatusCode, "the configured hosts replace the loopback names")
	resp, _ = do("GET", base+"/health", "", "gpu1.internal:8000", "", "")
	require.Equal(t, 200, resp.StatusCode)
	resp, b = do("POST", base+"/v1/completions", "application/json", "api.example", "https://app.example", body)
	require.Equal(t, 200, resp.StatusCode, b)
	require.Equal(t, "https://app.example", resp.Header.Get("Access-Control-Allow-Origin"))
	req, err := http.NewRequest("OPTIONS", base+"/v1/completions", nil)
	require.NoError(t, err)
	req.Host = "api.example"
	req.Header.Set("Origin", "https://app.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	pre, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	pre.Body.Close()
	require.Equal(t, 204, pre.StatusCode)
	require.Contains(t, pre.Header.Get("Access-Control-Allow-Headers"), "Content-Type")
	resp, _ = do("POST", base+"/v1/completions", "application/json", "api.example", "https://other.example", body)
	require.Equal(t, 403, resp.StatusCode)
}

// With API keys and TLS on, /metrics takes the same keys and TLS; the
// server.metrics_plaintext opt-out serves it as before.
func TestMetricsBehindTLSAndKeys(t *testing.T) {
	admin := "admin-key-0123456789"
	f := testcert.Write(t.TempDir())
	h := start(t, setup{cfg: func(c *config.Config) {
		c.Server.TLS = accessTLS(f.ServerCert, f.ServerKey, "")
		c.Server.Auth.APIKeysFile = keyFile(t, "alice-key-0123456789")
		c.Server.Auth.AdminKeysFile = keyFile(t, admin)
	}})
	pem, err := os.ReadFile(f.CA)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(pem))
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}}}
	url := "https://" + h.srv.MetricsAddr() + "/metrics"
	resp, b := call(t, hc, "GET", url, "", "")
	require.Equal(t, 401, resp.StatusCode, b)
	resp, b = call(t, hc, "GET", url, admin, "")
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, b, "glmflash_cache_slots")
	if resp, err := http.Get("http://" + h.srv.MetricsAddr() + "/metrics"); err == nil {
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode, "plain HTTP to the HTTPS metrics port")
	}

	h2 := start(t, setup{cfg: func(c *config.Config) {
		c.Server.Auth.APIKeysFile = keyFile(t, "alice-key-0123456789")
		c.Server.MetricsPlaintext = true
	}})
	code, err := get(t, "http://"+h2.srv.MetricsAddr()+"/metrics")
	require.NoError(t, err)
	require.Equal(t, 200, code, "opted out: plain and without keys")
}

// Request ids are per API key: bob may use the id alice uses (no
// ALREADY_EXISTS, nothing learnt of hers), alice reusing her own is still
// refused, and each key's Abort reaches only its own request.
func TestRequestIDsScopedPerKey(t *testing.T) {
	alice, bob, admin := "alice-key-0123456789", "bob-key-0123456789ab", "admin-key-0123456789"
	h := start(t, setup{cfg: func(c *config.Config) {
		c.Server.Auth.APIKeysFile = keyFile(t, alice, bob)
		c.Server.Auth.AdminKeysFile = keyFile(t, admin)
	}})
	open := func(key string) (pb.GLMFlash_GenerateClient, context.CancelFunc) {
		ctx, cancel := context.WithCancel(withKey(key))
		st, err := h.client.Generate(ctx, &pb.GenerateRequest{RequestId: "same", PromptIds: prompt(4, 1), MaxTokens: ptr(uint32(4000)), Sampling: greedy(), IgnoreEos: true})
		require.NoError(t, err)
		_, err = st.Recv()
		require.NoError(t, err, "%s's stream", key)
		md, err := st.Header()
		require.NoError(t, err)
		require.Equal(t, []string{"same"}, md.Get(RequestIDHeader), "the client's own id, not the server's")
		return st, cancel
	}
	sa, ca := open(alice)
	defer ca()
	sb, cb := open(bob)
	defer cb()
	st, err := h.client.Generate(withKey(alice), &pb.GenerateRequest{RequestId: "same", PromptIds: prompt(4, 1), MaxTokens: ptr(uint32(4))})
	require.NoError(t, err)
	_, err = st.Recv()
	require.Equal(t, codes.AlreadyExists, status.Code(err), "a key's own id in flight is still refused: %v", err)

	_, err = h.client.Abort(withKey(admin), &pb.AbortRequest{RequestId: "same"})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "two keys use it: the admin must say whose")
	_, err = h.client.Abort(withKey(bob), &pb.AbortRequest{RequestId: "same"})
	require.NoError(t, err)
	finishOf := func(st pb.GLMFlash_GenerateClient) *pb.Finish {
		for {
			m, err := st.Recv()
			require.NoError(t, err)
			if f := m.GetFinish(); f != nil {
				return f
			}
		}
	}
	fb := finishOf(sb)
	require.Equal(t, pb.FinishReason_FINISH_REASON_ABORT, fb.Reason)
	require.Equal(t, "same", fb.RequestId)
	// alice's goes on; now the only "same" in flight, an admin may abort it by its id
	_, err = h.client.Abort(withKey(admin), &pb.AbortRequest{RequestId: "same"})
	require.NoError(t, err)
	require.Equal(t, pb.FinishReason_FINISH_REASON_ABORT, finishOf(sa).Reason)
}

// max_tokens near 2⁶³ does not wrap the context check (prompt +
// max_tokens overflowed int64 and ran to the full context).
func TestHugeMaxTokensIsRefused(t *testing.T) {
	h := start(t, setup{})
	base := "http://" + h.srv.HTTPAddr()
	for _, mt := range []string{"9223372036854775807", "9223372036854775806", "4294967296"} {
		resp, b := call(t, http.DefaultClient, "POST", base+"/v1/completions", "", `{"prompt":[1,2,3],"max_tokens":`+mt+`}`)
		require.Equal(t, 400, resp.StatusCode, "%s: %s", mt, b)
		require.Contains(t, b, `"param":"max_tokens"`)
		require.Contains(t, b, "exceed the context limit")
	}
	_, err := generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: prompt(3, 1), MaxTokens: ptr(uint32(1<<32 - 1))})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Contains(t, err.Error(), "max_tokens")
}

// A layer the model does not have in debug.capture_hidden (or an
// adapter's layers) is refused at load, naming the key.
func TestCaptureOfAMissingLayerIsRefused(t *testing.T) {
	cfg := config.Default()
	cfg.Model.Dir, cfg.Model.Preset = fixture, ""
	cfg.Server.GRPCAddr, cfg.Server.HTTPAddr, cfg.Server.MetricsAddr = "127.0.0.1:0", "", ""
	cfg.Debug.CaptureHidden = []int{4000}
	srv, err := New(cfg, Options{Load: fixtureLoader(nil)})
	require.NoError(t, err)
	err = srv.Serve(context.Background())
	require.ErrorContains(t, err, "debug.capture_hidden[0]")
	require.ErrorContains(t, err, "layer 4000: the model has")
}

// A gRPC client that stops reading a Generate stream does not keep the
// handler and its request: a message that cannot be sent within
// server.write_timeout (flow control full) ends the stream and aborts the
// request.
func TestStalledGRPCReaderReleasesItsHandler(t *testing.T) {
	h := start(t, setup{rt: config.Runtime{Slots: 2, DefaultMaxTokens: 16}, opts: withText(t), cfg: func(c *config.Config) {
		c.Server.WriteTimeout = 300 * time.Millisecond
	}})
	conn, err := grpc.NewClient(h.srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10)) // no window growth: the stall comes soon
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := pb.NewGLMFlashClient(conn).Generate(ctx, &pb.GenerateRequest{PromptIds: prompt(4, 1), MaxTokens: ptr(uint32(4000)), Sampling: greedy(), IgnoreEos: true, TopLogprobs: 20})
	require.NoError(t, err)
	_, err = st.Recv() // then the client reads no more
	require.NoError(t, err)
	rt := h.srv.Runtime()
	deadline := time.Now().Add(20 * time.Second)
	for {
		w, r := rt.InFlight()
		if w+r == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the stalled stream still holds its request")
		time.Sleep(50 * time.Millisecond)
	}
	require.Less(t, scrape(t, h.srv, "glmflash_generated_tokens_total"), 4000.0, "ended early, not run to its length")
	for { // reading again, the client finds the stream ended with DEADLINE_EXCEEDED
		if _, err = st.Recv(); err != nil {
			break
		}
	}
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	require.Contains(t, err.Error(), "server.write_timeout")
}
