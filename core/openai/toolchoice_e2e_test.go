package openai_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/tokenizer"
)

// tool_choice "required" and a named function, with random weights
// (temperature 1): every reply is a call of an allowed tool whose
// arguments follow its parameters, finishing with tool_calls — with
// thinking off and with the reply left free to reason first.
func TestToolChoiceForcedRandomWeights(t *testing.T) {
	cfg, err := os.ReadFile("../../model/randckpt/tokenizer_config.json")
	require.NoError(t, err)
	tm, err := chat.Parse(cfg, "")
	require.NoError(t, err)
	s := startText(t, nil, nil, func(tk *tokenizer.Tokenizer) *text.Model {
		return &text.Model{Tok: tk, Chat: tm, ToolCallParser: "glm45", ReasoningParser: "glm45"}
	})
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
