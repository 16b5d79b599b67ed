package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func parseIDs(flag, s string) ([]int32, error) {
	var out []int32
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a token id", flag, f)
		}
		out = append(out, int32(v))
	}
	return out, nil
}

func newGenerateCmd() *cobra.Command {
	var mf modelFlags
	var prompt, stops, dump string
	var textPrompt, chatMsg, system string
	var maxTokens int
	var ignoreEOS bool
	var sp sample.Params
	cmd := &cobra.Command{
		Use:   "generate (--model DIR | --preset NAME) (--prompt TEXT | --chat TEXT | --prompt-ids 1,2,3) --max-tokens N",
		Args:  cobra.NoArgs,
		Short: "Generate from a text prompt, a chat message or token ids (greedy, or seeded sampling)",
		RunE: func(cmd *cobra.Command, args []string) error {
			given := 0
			for _, s := range []string{prompt, textPrompt, chatMsg} {
				if s != "" {
					given++
				}
			}
			if given != 1 {
				return fmt.Errorf("give exactly one of --prompt, --chat and --prompt-ids")
			}
			if system != "" && chatMsg == "" {
				return fmt.Errorf("--system applies to --chat only; without it it would be ignored")
			}
			ids, err := parseIDs("--prompt-ids", prompt)
			if err != nil {
				return err
			}
			stopIDs, err := parseIDs("--stop-ids", stops)
			if err != nil {
				return err
			}
			if maxTokens < 1 {
				return fmt.Errorf("--max-tokens must be ≥ 1, got %d", maxTokens)
			}
			if err := sp.Validate(); err != nil {
				return err
			}
			ck, err := mf.open()
			if err != nil {
				return err
			}
			defer ck.Close()
			cfg := ck.Config()
			var tm *text.Model
			if prompt == "" {
				if tm, err = mf.textModel(cfg.VocabSize); err != nil {
					return err
				}
				if textPrompt != "" {
					ids, err = tm.EncodePrompt(cmd.Context(), textPrompt, 0)
				} else {
					var msgs []chat.Message
					if system != "" {
						msgs = append(msgs, chat.Message{Role: "system", Content: system})
					}
					var rendered string
					rendered, ids, err = tm.EncodeChat(cmd.Context(), append(msgs, chat.Message{Role: "user", Content: chatMsg}), 0)
					if err == nil && log.GetLevel() <= zerolog.DebugLevel {
						log.Debug().Str("prompt", rendered).Msg("chat template")
					}
				}
				if err != nil {
					return err
				}
			}
			promptFlag := "--prompt-ids"
			switch {
			case textPrompt != "":
				promptFlag = "--prompt"
			case chatMsg != "":
				promptFlag = "--chat"
			}
			if len(ids) == 0 {
				return fmt.Errorf("%s: the prompt is empty", promptFlag)
			}
			for i, id := range ids {
				if id < 0 || int(id) >= cfg.VocabSize {
					return fmt.Errorf("%s: token %d (%d) is outside the vocabulary [0, %d)", promptFlag, i, id, cfg.VocabSize)
				}
			}
			if len(ids)+maxTokens > cfg.MaxPositionEmbeddings {
				return fmt.Errorf("--max-tokens: the prompt (%d tokens) + --max-tokens (%d) exceed max_position_embeddings (%d)", len(ids), maxTokens, cfg.MaxPositionEmbeddings)
			}
			if err := dumpGraph(dump, cfg, graph.Decode, graph.LastLogits); err != nil {
				return err
			}
			e, err := newEngine(ck, &mf, 1)
			if err != nil {
				return err
			}
			defer e.Close()
			slot, _ := e.Store().Alloc()
			smp := sample.New(sp)
			t0 := time.Now()
			res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: ids}}})
			if err != nil {
				return err
			}
			prefill := time.Since(t0)
			var out []int32
			var stream *tokenizer.Stream
			if tm != nil {
				stream = tm.Tok.NewStream(true)
			}
			t1 := time.Now()
			finish := "length"
			for len(out) < maxTokens {
				if err := sample.CheckFinite(res.Row(0)); err != nil {
					return fmt.Errorf("after %d generated tokens: %w", len(out), err)
				}
				tok := int32(smp.Next(res.Row(0)))
				out = append(out, tok)
				// a stop id or the model's EOS ends generation; like the
				// servers' text layer, its text is not printed
				stop := contains(stopIDs, tok) || (!ignoreEOS && slices.Contains(cfg.EOSTokenIDs, int(tok)))
				if stream != nil && !stop {
					fmt.Print(stream.Next(tok))
				}
				if stop {
					finish = "stop"
					break
				}
				if len(out) == maxTokens {
					break
				}
				res, err = e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: []int32{tok}}}})
				if err != nil {
					return err
				}
			}
			decode := time.Since(t1)
			if stream != nil {
				fmt.Println(stream.Flush())
			}
			strs := make([]string, len(out))
			for i, t := range out {
				strs[i] = strconv.Itoa(int(t))
			}
			fmt.Printf("prompt   %d tokens\n", len(ids))
			fmt.Printf("output   %s\n", strings.Join(strs, ","))
			fmt.Printf("finish   %s\n", finish)
			fmt.Printf("prefill  %.1f tokens/s (%d tokens in %s)\n", float64(len(ids))/prefill.Seconds(), len(ids), prefill.Round(time.Microsecond))
			if n := len(out) - 1; n > 0 {
				fmt.Printf("decode   %.1f tokens/s (%d steps in %s)\n", float64(n)/decode.Seconds(), n, decode.Round(time.Microsecond))
			}
			return nil
		},
	}
	mf.addConfig(cmd)
	mf.addDevice(cmd)
	mf.addPrecision(cmd)
	mf.addTP(cmd)
	mf.add(cmd, true)
	mf.addCheckTensors(cmd)
	cmd.Flags().StringVar(&prompt, "prompt-ids", "", "comma-separated prompt token ids")
	cmd.Flags().StringVar(&textPrompt, "prompt", "", "prompt text (the checkpoint's tokenizer.json encodes it); the output is printed as text")
	cmd.Flags().StringVar(&chatMsg, "chat", "", "a user message, rendered with the checkpoint's chat template")
	cmd.Flags().StringVar(&system, "system", "", "with --chat: a system message before it")
	cmd.Flags().StringVar(&stops, "stop-ids", "", "comma-separated token ids that end generation")
	cmd.Flags().BoolVar(&ignoreEOS, "ignore-eos", false, "go on past the model's end-of-sequence ids (eos_token_id of config.json and generation_config.json), which otherwise stop generation")
	cmd.Flags().IntVar(&maxTokens, "max-tokens", 16, "tokens to generate")
	cmd.Flags().Float64Var(&sp.Temperature, "temperature", 0, "sampling temperature (0 = greedy)")
	cmd.Flags().IntVar(&sp.TopK, "top-k", 0, "keep the k most likely tokens (0 = off)")
	cmd.Flags().Float64Var(&sp.TopP, "top-p", 1, "nucleus sampling mass (1 = off)")
	cmd.Flags().Float64Var(&sp.MinP, "min-p", 0, "drop tokens below min-p × the top probability (0 = off)")
	cmd.Flags().Uint64Var(&sp.Seed, "sample-seed", 0, "sampling seed (same seed ⇒ same tokens)")
	cmd.Flags().StringVar(&dump, "dump-graph", "", "print the decode graph first: summary or text")
	return cmd
}

func contains(s []int32, v int32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
