package openai_test

import (
	"context"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
	"github.com/stretchr/testify/require"
)

// The requests of a tool round trip, as openai-go sends them (tools, an
// assistant turn with tool_calls, the tool's result with its
// tool_call_id, tool_choice, parallel_tool_calls, chat_template_kwargs),
// are served on the tiny fixture through the presets' GLM-4.5 template,
// whole and streamed, with the glm45 parsers on.
func TestToolRoundTripRequests(t *testing.T) {
	s := startGLM(t)
	ctx := context.Background()
	weather := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name:        "get_weather",
		Description: openai.String("The weather of a city"),
		Parameters:  shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}},
	})
	ask := openai.ChatCompletionNewParams{
		Model:       "tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Beijing?")},
		Tools:       []openai.ChatCompletionToolUnionParam{weather},
		ToolChoice:  openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")},
		MaxTokens:   openai.Int(8),
		Temperature: openai.Float(0),
	}
	res, err := s.cli.Chat.Completions.New(ctx, ask)
	require.NoError(t, err)
	require.Len(t, res.Choices, 1)
	require.Contains(t, []string{"stop", "length", "tool_calls"}, res.Choices[0].FinishReason)

	// The model's call (as a client keeps it) and the tool's answer.
	answer := ask
	answer.Messages = append(answer.Messages,
		openai.ChatCompletionMessageParamUnion{OfAssistant: &openai.ChatCompletionAssistantMessageParam{
			ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID:       "call_1",
				Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "get_weather", Arguments: `{"city":"Beijing"}`},
			}}},
		}},
		openai.ToolMessage("sunny, 25°C", "call_1"),
	)
	answer.ParallelToolCalls = openai.Bool(false)
	answer.SetExtraFields(map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}})
	res, err = s.cli.Chat.Completions.New(ctx, answer)
	require.NoError(t, err)
	require.Len(t, res.Choices, 1)
	require.Positive(t, res.Usage.PromptTokens)

	st := s.cli.Chat.Completions.NewStreaming(ctx, answer)
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		require.True(t, acc.AddChunk(st.Current()))
	}
	require.NoError(t, st.Err())
	require.Len(t, acc.Choices, 1)
	require.NotEmpty(t, acc.Choices[0].FinishReason)

	// A tool message without its call's id is refused, naming the field.
	bad := ask
	bad.Messages = append(bad.Messages, openai.ToolMessage("x", ""))
	_, err = s.cli.Chat.Completions.New(ctx, bad)
	var ae *openai.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 400, ae.StatusCode)
	require.Equal(t, "messages[1].tool_call_id", ae.Param)

	// chat_template_kwargs arrive (a reserved name is refused by name).
	bad = ask
	bad.SetExtraFields(map[string]any{"chat_template_kwargs": map[string]any{"messages": 1}})
	_, err = s.cli.Chat.Completions.New(ctx, bad)
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "chat_template_kwargs.messages", ae.Param)
}
