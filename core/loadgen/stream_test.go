package loadgen

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// piece is a part of a scripted stream and the time it arrives.
type piece struct {
	at   time.Duration
	data string
}

// scripted is a reader that returns one piece per Read and sets the clock
// to the piece's time: each event is stamped exactly with the time of the
// piece that completed it.
type scripted struct {
	pieces []piece
	clock  time.Duration
}

func (s *scripted) Read(p []byte) (int, error) {
	if len(s.pieces) == 0 {
		return 0, io.EOF
	}
	pc := &s.pieces[0]
	s.clock = pc.at
	n := copy(p, pc.data)
	pc.data = pc.data[n:]
	if pc.data == "" {
		s.pieces = s.pieces[1:]
	}
	return n, nil
}

func (s *scripted) now() time.Duration { return s.clock }

const ms_ = time.Millisecond

// The stream's events are stamped when they complete: the role-only and
// empty events carry no output, an event split over two reads counts at
// its second part, comments and unknown fields are skipped, multi-line data
// is joined, CRLF ends lines, and the usage comes from the final chunk.
func TestReadStreamStampsEveryOutputEvent(t *testing.T) {
	s := &scripted{pieces: []piece{
		{5 * ms_, ": keep-alive\n\nevent: message\nid: 1\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"},
		{100 * ms_, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"He\"}}]}\r\n\r\n"},
		{130 * ms_, "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"llo\"}}]}\n"},
		{150 * ms_, "\n"}, // the event ends here
		{170 * ms_, "data: {\"choices\":[{\"index\":0,\n"},
		{180 * ms_, "data: \"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n"},
		{220 * ms_, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"},
		{221 * ms_, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":5,\"total_tokens\":12}}\n\n"},
		{222 * ms_, "data: [DONE]\n\n"},
		{300 * ms_, "data: {\"never\": \"read\"}\n\n"},
	}}
	res, err := readStream(s, s.now)
	require.Nil(t, err)
	require.Equal(t, []time.Duration{100 * ms_, 150 * ms_, 180 * ms_}, res.Chunks)
	require.Equal(t, 222*ms_, res.End)
	require.Equal(t, &usage{PromptTokens: 7, CompletionTokens: 5}, res.Usage)
	require.Equal(t, "length", res.FinishReason)
}

// A completion stream's text events; the last event may lack its blank
// line; a stream that ends after its finish but before [DONE] is complete.
func TestReadStreamCompletionsEnds(t *testing.T) {
	s := &scripted{pieces: []piece{
		{10 * ms_, "data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":null}]}\n\n"},
		{20 * ms_, "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"stop\"}]}\n\n"},
		{25 * ms_, "data: [DONE]"},
	}}
	res, err := readStream(s, s.now)
	require.Nil(t, err)
	require.Equal(t, []time.Duration{10 * ms_}, res.Chunks)
	require.Equal(t, 25*ms_, res.End)
	require.Nil(t, res.Usage)

	s = &scripted{pieces: []piece{
		{10 * ms_, "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"},
		{20 * ms_, "data: {\"choices\":[{\"index\":0,\"text\":\"b\",\"finish_reason\":\"length\"}]}\n\n"},
		{30 * ms_, ""},
	}}
	res, err = readStream(s, s.now)
	require.Nil(t, err, "every chunk came; only [DONE] is missing")
	require.Equal(t, []time.Duration{10 * ms_, 20 * ms_}, res.Chunks)
	require.Equal(t, 30*ms_, res.End)
}

// Broken streams are errors of their kind, with what came before.
func TestReadStreamFailures(t *testing.T) {
	for name, c := range map[string]struct {
		pieces []piece
		kind   string
		msg    string
		chunks int
	}{
		"eof before the end": {[]piece{{10 * ms_, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"}}, KindBrokenStream, "ended before its last chunk", 1},
		"error event": {[]piece{{10 * ms_, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"},
			{20 * ms_, "data: {\"error\":{\"message\":\"generation failed: boom\",\"type\":\"server_error\"}}\n\n"}}, KindStreamError, "server_error: generation failed: boom", 1},
		"not json":         {[]piece{{10 * ms_, "data: {\"choices\":[{\"text\"\n\n"}}, KindBadChunk, "is not a JSON chunk", 0},
		"empty stream":     {nil, KindBrokenStream, "ended before its last chunk", 0},
		"error as string":  {[]piece{{1, "data: {\"error\":\"overloaded\"}\n\n"}}, KindStreamError, "overloaded", 0},
		"chunk wrong type": {[]piece{{1, "data: [1,2]\n\n"}}, KindBadChunk, "is not a JSON chunk", 0},
		"negative usage":   {[]piece{{1, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":-1}}\n\n"}}, KindBadChunk, "usage with negative token counts", 0},
	} {
		t.Run(name, func(t *testing.T) {
			s := &scripted{pieces: c.pieces}
			res, err := readStream(s, s.now)
			require.NotNil(t, err)
			require.Equal(t, c.kind, err.Kind)
			require.Contains(t, err.Msg, c.msg)
			require.Len(t, res.Chunks, c.chunks)
		})
	}
}

// errReader fails after its data: a connection that breaks mid-stream.
type errReader struct{ data string }

func (e *errReader) Read(p []byte) (int, error) {
	if e.data == "" {
		return 0, io.ErrUnexpectedEOF
	}
	n := copy(p, e.data)
	e.data = e.data[n:]
	return n, nil
}

func TestReadStreamBrokenConnection(t *testing.T) {
	res, err := readStream(&errReader{"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"cho"}, func() time.Duration { return 0 })
	require.NotNil(t, err)
	require.Equal(t, KindBrokenStream, err.Kind)
	require.Contains(t, err.Msg, "unexpected EOF")
	require.Len(t, res.Chunks, 1)
}

// The stream reader never panics on what a server sends; the times it
// stamps never go back; a stream it accepts ended ([DONE] or a finish).
func FuzzReadStream(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\r\n\r\n",
		": c\n\nevent: x\ndata: {\"error\":{\"message\":\"m\"}}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":-3}}\n\ndata:[DONE]",
		"data: {\"choices\":[{\"text\":\"a\"\ndata: }]}\n\n", "data", "\n\n\n", "data: null\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var tick time.Duration
		res, err := readStream(bytes.NewReader(b), func() time.Duration { tick += ms_; return tick })
		for i := 1; i < len(res.Chunks); i++ {
			require.GreaterOrEqual(t, res.Chunks[i], res.Chunks[i-1])
		}
		if err == nil {
			require.True(t, res.End > 0)
			if len(res.Chunks) > 0 {
				require.GreaterOrEqual(t, res.End, res.Chunks[len(res.Chunks)-1])
			}
		} else {
			require.NotEmpty(t, err.Kind)
		}
	})
}
