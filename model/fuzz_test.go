package model

import (
	"os"
	"testing"
)

func FuzzParseConfig(f *testing.F) {
	b, err := os.ReadFile(fixtureDir + "/config.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"model_type":"glm5_next_text"}`))
	f.Add([]byte(`{"num_hidden_layers":4,"linear_attn_config":{"kda_layers":[1,2,3],"full_attn_layers":[4]},"index_topk_pattern":"FSFS"}`))
	f.Add([]byte(`{"model_type":"glm5_next","text_config":{"num_hidden_layers":2},"quantization_config":{"quant_method":"fp8","weight_block_size":[0,-1]}}`))
	f.Add([]byte(`{"num_hidden_layers":3,"index_topk_freq":-2,"index_skip_topk_offset":-9,"first_k_dense_replace":-1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data, "fuzz.json")
		if err != nil {
			return
		}
		for i := -1; i <= c.NumHiddenLayers; i++ {
			c.IsKDA(i)
			c.IsDSA(i)
			c.IsMoE(i)
			c.IndexerSource(i)
		}
		if c.Validate() != nil {
			return
		}
		if int64(c.NumHiddenLayers)*int64(c.NRoutedExperts+8) < 5000 {
			for _, s := range c.WeightCatalog(true) {
				for _, d := range s.Shape {
					if d < 0 {
						t.Fatalf("%s: negative dimension in %v", s.Name, s.Shape)
					}
				}
			}
		}
		if _, err := c.MarshalHF(); err != nil {
			t.Fatalf("MarshalHF of a valid config: %v", err)
		}
	})
}

func FuzzParseDFlashConfig(f *testing.F) {
	f.Add([]byte(dflashJSON))
	f.Add([]byte(`{"architectures":["DFlashDraftModel"],"block_size":8,"num_target_layers":3,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":5,"num_attention_heads":2,"dflash_config":{"mask_token_id":1}}`))
	f.Add([]byte(`{"architectures":["DFlashDraftModel"],"dflash_config":{"target_layer_ids":[-1,1e30]},"layer_types":[1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseDFlashConfig(data, "fuzz.json")
		if err != nil {
			return
		}
		if c.Validate() != nil {
			t.Fatalf("ParseDFlashConfig accepted a config that does not validate")
		}
		if int64(c.NumHiddenLayers)*int64(c.HiddenSize+c.IntermediateSize) < 1<<20 {
			for _, s := range c.WeightCatalog() {
				for _, d := range s.Shape {
					if d < 1 {
						t.Fatalf("%s: dimension %d in %v", s.Name, d, s.Shape)
					}
				}
			}
		}
		b, err := c.MarshalHF()
		if err != nil {
			t.Fatalf("MarshalHF of a valid drafter config: %v", err)
		}
		back, err := ParseDFlashConfig(b, "marshalled")
		if err != nil {
			t.Fatalf("a marshalled drafter config does not parse: %v", err)
		}
		if back.BlockSize != c.BlockSize || len(back.TargetLayerIDs) != len(c.TargetLayerIDs) {
			t.Fatalf("round trip changed the config: %+v → %+v", c, back)
		}
	})
}
