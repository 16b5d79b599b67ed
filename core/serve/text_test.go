package serve

import (
	"context"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// withText serves the fixture with a bytes-only tokenizer (its vocabulary
// is 256) and a chat template without special tokens.
func withText(t *testing.T) func(*Options) { return withTokenizer(t, 256) }

// withTokenizer serves the fixture with a random tokenizer of vocab ids
// and withText's chat template.
func withTokenizer(t *testing.T, vocab int) func(*Options) {
	tj, _, err := randckpt.TokenizerFiles(vocab)
	require.NoError(t, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(t, err)
	tm, err := chat.Parse([]byte(`{"chat_template":"{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"}`), "")
	require.NoError(t, err)
	return func(o *Options) {
		load := o.Load
		o.Load = func(ctx context.Context) (*LoadedModel, error) {
			lm, err := load(ctx)
			if err == nil {
				lm.Text = &text.Model{Tok: tk, Chat: tm}
			}
			return lm, err
		}
	}
}

// Generate takes a prompt string or chat messages instead of ids, streams
// the text beside the ids, and honours stop strings.
func TestGenerateText(t *testing.T) {
	h := start(t, setup{opts: withText(t)})
	ctx := context.Background()
	zero, n := 0.0, uint32(20)
	greedy := &pb.SamplingParams{Temperature: &zero}
	prompt := "Hello"
	byText, err := generate(ctx, h.client, &pb.GenerateRequest{Prompt: prompt, MaxTokens: &n, Sampling: greedy})
	require.NoError(t, err)
	ids := make([]int32, len(prompt))
	for i := range prompt {
		ids[i] = int32(prompt[i])
	}
	byIDs, err := generate(ctx, h.client, &pb.GenerateRequest{PromptIds: ids, MaxTokens: &n, Sampling: greedy})
	require.NoError(t, err)
	require.Equal(t, byIDs.tokens, byText.tokens, "the text prompt is its bytes")
	require.Len(t, byText.tokens, 20)
	tk, err := tokenizer.Parse(func() []byte { b, _, _ := randckpt.TokenizerFiles(256); return b }())
	require.NoError(t, err)
	require.Equal(t, tk.Decode(byText.tokens, true), byText.text, "streamed text = decoded ids")

	// A stop string from the middle of the text.
	r := []rune(byText.text)
	require.Greater(t, len(r), 8)
	stop := string(r[3:6])
	res, err := generate(ctx, h.client, &pb.GenerateRequest{Prompt: prompt, MaxTokens: &n, Sampling: greedy, Stop: []string{stop}})
	require.NoError(t, err)
	require.Equal(t, byText.text[:strings.Index(byText.text, stop)], res.text)
	require.Equal(t, pb.FinishReason_FINISH_REASON_STOP, res.finish.Reason)
	require.Equal(t, stop, res.finish.Stop)

	// Chat messages.
	res, err = generate(ctx, h.client, &pb.GenerateRequest{Messages: []*pb.ChatMessage{{Role: "user", Content: "hi"}}, MaxTokens: &n, Sampling: greedy})
	require.NoError(t, err)
	require.Equal(t, uint32(len("user: hi\nassistant:")), res.finish.Usage.PromptTokens)

	for _, c := range []struct {
		req  *pb.GenerateRequest
		want string
	}{
		{&pb.GenerateRequest{Prompt: "x", PromptIds: []int32{1}}, "prompt_ids: give exactly one of"},
		{&pb.GenerateRequest{}, "prompt_ids: give exactly one of"},
		{&pb.GenerateRequest{Messages: []*pb.ChatMessage{{Role: "wizard", Content: "x"}}}, "messages[0].role"},
		{&pb.GenerateRequest{Prompt: "x", Stop: []string{""}}, "stop[0]"},
	} {
		_, err := generate(ctx, h.client, c.req)
		require.Equal(t, codes.InvalidArgument, status.Code(err), c.want)
		require.ErrorContains(t, err, c.want)
	}
}

// Without a tokenizer, text prompts are refused with a precise error.
func TestGenerateTextWithoutTokenizer(t *testing.T) {
	h := start(t, setup{})
	_, err := generate(context.Background(), h.client, &pb.GenerateRequest{Prompt: "x"})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorContains(t, err, "prompt: the model has no tokenizer.json")
}

// A chat template that failed to load: Generate serves prompts and
// refuses messages with the template's error, and GetModelInfo says why.
func TestBrokenTemplateInModelInfo(t *testing.T) {
	tj, _, err := randckpt.TokenizerFiles(256)
	require.NoError(t, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(t, err)
	_, perr := chat.Parse([]byte(`{"chat_template":"{{ raise_exception('this template is broken') }}"}`), "")
	require.Error(t, perr)
	h := start(t, setup{opts: func(o *Options) {
		load := o.Load
		o.Load = func(ctx context.Context) (*LoadedModel, error) {
			lm, err := load(ctx)
			if err == nil {
				lm.Text = &text.Model{Tok: tk, ChatError: perr}
			}
			return lm, err
		}
	}})
	ctx := context.Background()
	info, err := h.client.GetModelInfo(ctx, &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	require.False(t, info.GetModel().GetChat())
	require.Contains(t, info.GetModel().GetChatTemplateError(), "this template is broken")
	n := uint32(4)
	_, err = generate(ctx, h.client, &pb.GenerateRequest{Prompt: "Hello", MaxTokens: &n})
	require.NoError(t, err)
	_, err = generate(ctx, h.client, &pb.GenerateRequest{Messages: []*pb.ChatMessage{{Role: "user", Content: "hi"}}, MaxTokens: &n})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorContains(t, err, "this template is broken")
}
