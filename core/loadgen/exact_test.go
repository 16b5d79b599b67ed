package loadgen

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// virtualTransport answers every request with a scripted SSE stream whose
// reads move a virtual clock: each event arrives exactly at its scripted
// offset after the request (one request at a time), so every figure of
// the run can be worked out by hand.
type virtualTransport struct {
	clock   atomic.Int64 // ns
	scripts map[int32][]piece
}

func (v *virtualTransport) now() time.Duration { return time.Duration(v.clock.Load()) }

func (v *virtualTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var b struct {
		Prompt []int32 `json:"prompt"`
	}
	raw, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, err
	}
	base := v.now()
	var pieces []piece
	for _, p := range v.scripts[b.Prompt[0]] {
		pieces = append(pieces, piece{at: base + p.at, data: p.data})
	}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(&clockedReader{v: v, pieces: pieces}), Request: r}, nil
}

type clockedReader struct {
	v      *virtualTransport
	pieces []piece
	cur    *bytes.Reader
}

func (c *clockedReader) Read(p []byte) (int, error) {
	if c.cur == nil || c.cur.Len() == 0 {
		if len(c.pieces) == 0 {
			return 0, io.EOF
		}
		c.v.clock.Store(int64(c.pieces[0].at))
		c.cur = bytes.NewReader([]byte(c.pieces[0].data))
		c.pieces = c.pieces[1:]
	}
	return c.cur.Read(p)
}

// stream scripts output events at the offsets (ms) with the tokens of
// each, then the finish, the usage and [DONE] at end (ms).
func stream(offsets []int, tokens []int, end int) []piece {
	var out []piece
	total := 0
	for i, at := range offsets {
		out = append(out, piece{at: time.Duration(at) * ms_, data: `data: {"choices":[{"text":"` + string(bytes.Repeat([]byte("x"), tokens[i])) + `"}]}` + "\n\n"})
		total += tokens[i]
	}
	e := time.Duration(end) * ms_
	out = append(out,
		piece{at: e, data: `data: {"choices":[{"text":"","finish_reason":"length"}]}` + "\n\n"},
		piece{at: e, data: `data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":` + itoa(total) + `}}` + "\n\n"},
		piece{at: e, data: "data: [DONE]\n\n"})
	return out
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// A whole run with a virtual clock, every figure worked by hand.
func TestRunExactFiguresOnAVirtualClock(t *testing.T) {
	vt := &virtualTransport{scripts: map[int32][]piece{
		// TTFT 100, events 100 120 150 (the last with 2 tokens), end 160:
		// 4 tokens, TPOT (160−100)/3 = 20, ITLs 20 30
		1: stream([]int{100, 120, 150}, []int{1, 1, 2}, 160),
		// TTFT 300, one event of 1 token, end 300: no TPOT, no ITL
		2: stream([]int{300}, []int{1}, 300),
		// TTFT 50, events 50 90 130 170, end 170: 4 tokens, TPOT 40, ITLs 40 40 40
		3: stream([]int{50, 90, 130, 170}, []int{1, 1, 1, 1}, 170),
	}}
	c := &Client{BaseURL: "http://virtual", HTTP: &http.Client{Transport: vt}}
	reqs := requests(1, 2, 3)
	for i := range reqs {
		reqs[i].OutputLen = 4
	}
	res, err := Run(t.Context(), Spec{Client: c, Endpoint: Completions, Model: "m", Requests: reqs, Concurrency: 1,
		RequestRate: math.Inf(1), IgnoreEOS: true, SLO: SLO{TTFT: 150 * ms_, TPOT: 30 * ms_}, Clock: vt.now, Log: zerolog.Nop()})
	require.NoError(t, err)
	require.Equal(t, 3, res.Completed)
	// one at a time: request k is sent when k−1 ended
	require.Equal(t, []time.Duration{0, 160 * ms_, 460 * ms_}, []time.Duration{res.Records[0].Sent, res.Records[1].Sent, res.Records[2].Sent})
	require.InDelta(t, 0.630, res.DurationS, 1e-12, "160 + 300 + 170 ms")
	require.Equal(t, 12, res.InputTokens)
	require.Equal(t, 9, res.OutputTokens)
	require.Equal(t, 8, res.OutputChunks)
	require.Equal(t, 1, res.LengthMismatch, "request 2 gave 1 of 4 tokens")
	require.InDelta(t, 3/0.63, res.RequestThroughput, 1e-9)
	require.InDelta(t, 9/0.63, res.OutputThroughput, 1e-9)
	require.InDelta(t, 21/0.63, res.TotalThroughput, 1e-9)
	require.InDelta(t, 1.0, res.Concurrency, 1e-9, "one in flight all the time")
	// TTFT 100 300 50 → sorted 50 100 300
	require.Equal(t, Dist{N: 3, Mean: 150, Std: r9(math.Sqrt((50*50 + 150*150 + 100*100) / 3.0)), Min: 50, P50: 100, P90: 260, P99: 296, Max: 300}, roundDist(res.TTFT))
	// TPOT 20 40
	require.Equal(t, Dist{N: 2, Mean: 30, Std: 10, Min: 20, P50: 30, P90: 38, P99: 39.8, Max: 40}, roundDist(res.TPOT))
	// ITL 20 30 40 40 40
	require.Equal(t, Dist{N: 5, Mean: 34, Std: r9(math.Sqrt((14*14 + 4*4 + 3*6*6) / 5.0)), Min: 20, P50: 40, P90: 40, P99: 40, Max: 40}, roundDist(res.ITL))
	require.Equal(t, Dist{N: 3, Mean: 210, Std: r9(math.Sqrt((50*50 + 90*90 + 40*40) / 3.0)), Min: 160, P50: 170, P90: 274, P99: 297.4, Max: 300}, roundDist(res.E2E))
	// client waits (sent − scheduled 0): 0 160 460
	require.InDelta(t, 620.0/3, res.ClientWait.Mean, 1e-9)
	// goodput: request 0 (TTFT 100, TPOT 20) only; 1 has TTFT 300, 2 TPOT 40
	require.Equal(t, 1, res.Goodput.Good)
	require.InDelta(t, 1/0.63, res.Goodput.Rate, 1e-9)
	require.InDelta(t, 1.0/3, res.Goodput.Fraction, 1e-12)
}
