package openai_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
	"github.com/stretchr/testify/require"
)

// tool_choice "required" and a named function, with random weights
// (temperature 1): every reply is a call of an allowed tool whose
// arguments follow its parameters, finishing with tool_calls — with
// thinking off and with the reply left free to reason first.
func TestToolChoiceForcedRandomWeights(t *testing.T) {
	s := startGLM(t)
	ctx := context.Background()
	weather := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name: "get_weather",
		Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{
			"city": map[string]any{"type": "string", "maxLength": 12}, "days": map[string]any{"type": "integer"},
		}, "required": []string{"city", "days"}},
	})
	clock := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "now"})
	for i := range 12 {
		p := openai.ChatCompletionNewParams{
			Model:       "tiny",
			Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Beijing?")},
			Tools:       []openai.ChatCompletionToolUnionParam{weather, clock},
			ToolChoice:  openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")},
			MaxTokens:   openai.Int(400),
			Temperature: openai.Float(1),
			Seed:        openai.Int(int64(i)),
		}
		if i%3 == 1 {
			p.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{
				Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"}}}
		}
		if i%2 == 0 {
			p.SetExtraFields(map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}})
		}
		res, err := s.cli.Chat.Completions.New(ctx, p)
		require.NoError(t, err)
		c := res.Choices[0]
		require.Equal(t, "tool_calls", c.FinishReason, "%d: %q", i, c.Message.Content)
		require.NotEmpty(t, c.Message.ToolCalls, "%d", i)
		for _, tc := range c.Message.ToolCalls {
			var args map[string]any
			require.NoError(t, json.Unmarshal([]byte(tc.Function.Arguments), &args), "%d: %q", i, tc.Function.Arguments)
			switch tc.Function.Name {
			case "get_weather":
				city, ok := args["city"].(string)
				require.True(t, ok, "%d: %v", i, args)
				require.LessOrEqual(t, len([]rune(city)), 12)
				days, ok := args["days"].(float64)
				require.True(t, ok && days == float64(int64(days)), "%d: %v", i, args)
			case "now":
				require.NotEqual(t, 1, i%3, "the named function only")
				require.Empty(t, args)
			default:
				t.Fatalf("%d: unknown function %q", i, tc.Function.Name)
			}
		}
	}
}

// A tool call's round trip through openai-go, as an agent runs it: the
// model is made to call (tool_choice required; random weights would never
// call otherwise), the call streams as delta.tool_calls that the SDK's
// accumulator assembles into the same call the whole response carries,
// the client runs the tool and sends the assistant's turn back with the
// tool's result (tool_call_id), and the model answers in text
// (tool_choice none): the second prompt renders the call and the result.
func TestToolCallRoundTrip(t *testing.T) {
	s := startGLM(t)
	ctx := context.Background()
	weather := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name: "get_weather",
		Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{
			"city": map[string]any{"type": "string", "maxLength": 10}, "days": map[string]any{"type": "integer"},
		}, "required": []string{"city", "days"}, "additionalProperties": false},
	})
	noThink := map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}}
	for seed := range 4 {
		msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Beijing for 3 days?")}
		p := openai.ChatCompletionNewParams{
			Model: "tiny", Messages: msgs, Tools: []openai.ChatCompletionToolUnionParam{weather},
			ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")},
			MaxTokens:  openai.Int(300), Temperature: openai.Float(1), Seed: openai.Int(int64(seed)),
		}
		p.SetExtraFields(noThink)

		// 1. the call, whole and streamed (the same seed: the same call)
		res, err := s.cli.Chat.Completions.New(ctx, p)
		require.NoError(t, err)
		c := res.Choices[0]
		require.Equal(t, "tool_calls", c.FinishReason)
		require.Len(t, c.Message.ToolCalls, 1, "parallel calls are one call here: one tool")
		call := c.Message.ToolCalls[0]
		require.Equal(t, "get_weather", call.Function.Name)
		require.Regexp(t, `^call_[0-9a-f]{24}$`, call.ID)
		var args struct {
			City *string `json:"city"`
			Days *int64  `json:"days"`
		}
		require.NoError(t, json.Unmarshal([]byte(call.Function.Arguments), &args), call.Function.Arguments)
		require.True(t, args.City != nil && args.Days != nil, call.Function.Arguments)

		st := s.cli.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		deltas := 0
		for st.Next() {
			ch := st.Current()
			acc.AddChunk(ch)
			if len(ch.Choices) > 0 && len(ch.Choices[0].Delta.ToolCalls) > 0 {
				deltas++
			}
		}
		require.NoError(t, st.Err())
		require.GreaterOrEqual(t, deltas, 2, "the name first, then the arguments")
		sc := acc.Choices[0]
		require.Equal(t, "tool_calls", sc.FinishReason)
		require.Len(t, sc.Message.ToolCalls, 1)
		require.Equal(t, call.Function.Name, sc.Message.ToolCalls[0].Function.Name)
		require.JSONEq(t, call.Function.Arguments, sc.Message.ToolCalls[0].Function.Arguments)

		// 2. the tool's result back, and an answer in text
		result := `{"city":"Beijing","forecast":["sun","rain","sun"]}`
		p2 := openai.ChatCompletionNewParams{
			Model:      "tiny",
			Messages:   append(msgs, c.Message.ToParam(), openai.ToolMessage(result, call.ID)),
			Tools:      []openai.ChatCompletionToolUnionParam{weather},
			ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")},
			MaxTokens:  openai.Int(8), Temperature: openai.Float(0),
		}
		p2.SetExtraFields(noThink)
		res2, err := s.cli.Chat.Completions.New(ctx, p2)
		require.NoError(t, err)
		require.Empty(t, res2.Choices[0].Message.ToolCalls, "tool_choice none: no call parsed")
		require.NotEmpty(t, res2.Choices[0].Message.Content)
		// the second prompt holds the first, the call and the result: longer
		// than the first by at least the result's and the call's text
		require.Greater(t, res2.Usage.PromptTokens, res.Usage.PromptTokens+int64(len(result)/4))
	}
}
