package serve

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/internal/testcert"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// call sends an HTTP request to the API with an optional key.
func call(t *testing.T, c *http.Client, method, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	return resp, string(b)
}

// The HTTP API checks the same API keys as gRPC (401 in OpenAI's error
// JSON; /health needs none), and a request it started belongs to its key:
// over gRPC only that key, or an admin key, may abort it.
func TestHTTPAPIKeysAndAbortOwnership(t *testing.T) {
	alice, bob, admin := "alice-key-0123456789", "bob-key-0123456789ab", "admin-key-0123456789"
	h := start(t, setup{cfg: func(c *config.Config) {
		c.Server.Auth.APIKeysFile = keyFile(t, alice, bob)
		c.Server.Auth.AdminKeysFile = keyFile(t, admin)
	}})
	base := "http://" + h.srv.HTTPAddr()
	c := http.DefaultClient
	body := `{"prompt":[1,2,3],"max_tokens":2}`
	for _, key := range []string{"", "wrong-key-0123456789"} {
		resp, b := call(t, c, "POST", base+"/v1/completions", key, body)
		require.Equal(t, 401, resp.StatusCode, b)
		require.Contains(t, b, `"code":"invalid_api_key"`)
		require.NotEmpty(t, resp.Header.Get("WWW-Authenticate"))
	}
	resp, _ := call(t, c, "GET", base+"/v1/models", "", "")
	require.Equal(t, 401, resp.StatusCode)
	resp, _ = call(t, c, "GET", base+"/health", "", "")
	require.Equal(t, 200, resp.StatusCode, "health needs no key")
	resp, b := call(t, c, "POST", base+"/v1/completions", bob, body)
	require.Equal(t, 200, resp.StatusCode, b)
	require.Equal(t, 3.0, scrapeWith(t, h.srv, `glmflash_requests_total{status="unauthenticated"}`, admin))
	// /metrics on the API's port (server.http_metrics) takes the API's keys.
	resp, _ = call(t, c, "GET", base+"/metrics", "", "")
	require.Equal(t, 401, resp.StatusCode)
	resp, b = call(t, c, "GET", base+"/metrics", bob, "")
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, b, `glmflash_requests_total{status="unauthenticated"} 4`)

	// A long stream started over HTTP with alice's key.
	req, err := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(`{"prompt":[1,2,3],"max_tokens":4000,"stream":true,"temperature":0}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+alice)
	req.Header.Set("Content-Type", "application/json")
	sresp, err := c.Do(req)
	require.NoError(t, err)
	defer sresp.Body.Close()
	require.Equal(t, 200, sresp.StatusCode)
	id := sresp.Header.Get("X-Request-Id")
	require.NotEmpty(t, id)
	_, err = h.client.Abort(withKey(bob), &pb.AbortRequest{RequestId: id})
	require.Equal(t, codes.NotFound, status.Code(err), "another caller cannot abort (or see) it")
	_, err = h.client.Abort(withKey(alice), &pb.AbortRequest{RequestId: id})
	require.NoError(t, err)
	sc := bufio.NewScanner(sresp.Body)
	sc.Buffer(nil, 1<<20)
	finished := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"finish_reason":"abort"`) {
			finished = true
		}
	}
	require.True(t, finished, "the stream ends as aborted")
}

// server.tls serves the HTTP API over HTTPS too, with the same client
// certificates required under mutual TLS.
func TestHTTPOverTLS(t *testing.T) {
	f := testcert.Write(t.TempDir())
	h := start(t, setup{cfg: func(c *config.Config) {
		c.Server.TLS = accessTLS(f.ServerCert, f.ServerKey, f.CA)
	}})
	pem, err := os.ReadFile(f.CA)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(pem))
	client := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool, ServerName: "127.0.0.1", Certificates: certs, MinVersion: tls.VersionTLS12}}}
	}
	kp, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	require.NoError(t, err)
	resp, b := call(t, client(kp), "GET", "https://"+h.srv.HTTPAddr()+"/v1/models", "", "")
	require.Equal(t, 200, resp.StatusCode, b)

	_, err = client().Get("https://" + h.srv.HTTPAddr() + "/v1/models")
	require.Error(t, err, "no client certificate")
	if resp, err := http.Get("http://" + h.srv.HTTPAddr() + "/health"); err == nil {
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode, "plain HTTP to an HTTPS server")
	}
}

// server.max_request_bytes bounds an HTTP body as it bounds a gRPC message.
func TestHTTPBodyBound(t *testing.T) {
	h := start(t, setup{cfg: func(c *config.Config) { c.Server.MaxRequestBytes = 1 << 10 }})
	base := "http://" + h.srv.HTTPAddr()
	resp, b := call(t, http.DefaultClient, "POST", base+"/v1/completions", "", `{"prompt":[1,2,3],"max_tokens":2,"user":"`+strings.Repeat("x", 2<<10)+`"}`)
	require.Equal(t, 413, resp.StatusCode, b)
	require.Contains(t, b, "server.max_request_bytes")
	resp, b = call(t, http.DefaultClient, "POST", base+"/v1/completions", "", `{"prompt":[1,2,3],"max_tokens":2}`)
	require.Equal(t, 200, resp.StatusCode, b)
}

// The model's EOS ends a text stream like a stop id: the EOS token is
// streamed and counted but adds no text; with ignore_eos its text is
// generated like any other.
func TestEOSAddsNoText(t *testing.T) {
	want := alone(t, prompt(7, 1), 10, sample.Greedy(), nil)
	k := 2
	for indexOf(want, want[k]) != k {
		k++ // an id whose first occurrence is at k
	}
	eos := want[k]
	withEOS := func(o *Options) {
		withText(t)(o)
		load := o.Load
		o.Load = func(ctx context.Context) (*LoadedModel, error) {
			lm, err := load(ctx)
			if err != nil {
				return nil, err
			}
			c := lm.Config.Clone()
			c.EOSTokenIDs = []int{int(eos)}
			lm.Config = c
			return lm, nil
		}
	}
	h := start(t, setup{opts: withEOS})
	tj, _, err := randckpt.TokenizerFiles(256)
	require.NoError(t, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(t, err)
	ctx := context.Background()

	r, err := generate(ctx, h.client, &pb.GenerateRequest{PromptIds: prompt(7, 1), MaxTokens: ptr(uint32(10)), Sampling: greedy()})
	require.NoError(t, err)
	require.Equal(t, pb.FinishReason_FINISH_REASON_STOP, r.finish.Reason)
	require.Equal(t, want[:k+1], r.tokens, "the EOS is streamed")
	require.Equal(t, tk.Decode(want[:k], true), r.text, "but adds no text")

	r, err = generate(ctx, h.client, &pb.GenerateRequest{PromptIds: prompt(7, 1), MaxTokens: ptr(uint32(10)), Sampling: greedy(), IgnoreEos: true})
	require.NoError(t, err)
	require.Equal(t, pb.FinishReason_FINISH_REASON_LENGTH, r.finish.Reason)
	require.Equal(t, tk.Decode(want, true), r.text)

	// The same over HTTP: finish_reason "stop" at the EOS (its text
	// withheld), and vLLM's ignore_eos goes on.
	complete := func(extra string) (string, string, int) {
		ids, err := json.Marshal(prompt(7, 1))
		require.NoError(t, err)
		resp, b := call(t, http.DefaultClient, "POST", "http://"+h.srv.HTTPAddr()+"/v1/completions", "", `{"prompt":`+string(ids)+`,"max_tokens":10,"temperature":0`+extra+`}`)
		require.Equal(t, 200, resp.StatusCode, b)
		var out struct {
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(b), &out))
		return out.Choices[0].Text, out.Choices[0].FinishReason, out.Usage.CompletionTokens
	}
	txt, reason, n := complete("")
	require.Equal(t, "stop", reason)
	require.Equal(t, k+1, n)
	require.Equal(t, tk.Decode(want[:k], true), txt)
	txt, reason, n = complete(`,"ignore_eos":true`)
	require.Equal(t, "length", reason)
	require.Equal(t, 10, n)
	require.Equal(t, tk.Decode(want, true), txt)
}
