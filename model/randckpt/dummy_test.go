package randckpt

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDummyIsWrite: the dummy checkpoint holds exactly the tensors, dtypes,
// shapes and bytes Write writes for the same preset, seed and layout (FP8
// block scales included), and the same config (quantization_config).
func TestDummyIsWrite(t *testing.T) {
	for _, c := range []struct {
		preset string
		set    map[string]json.RawMessage
		fp8    bool
	}{
		{"tiny", nil, false},
		{"tiny-mtp", nil, true},
		// the bench preset's sizes (vocabulary, hidden, experts) over 4 of
		// its layers (KDA+dense, then DSA+MoE at 3): 4 layers keep it cheap
		{"bench", map[string]json.RawMessage{"num_hidden_layers": json.RawMessage("4")}, true},
	} {
		cfg, err := PresetWith(c.preset, c.set)
		require.NoError(t, err)
		dir := t.TempDir()
		require.NoError(t, Write(dir, cfg, Options{Seed: 7, FP8: c.fp8}))
		disk, err := model.Open(dir)
		require.NoError(t, err)
		dummy, err := Dummy(cfg, DummyOptions{Seed: 7, FP8: c.fp8, Source: "dummy weights (random, seed 7) of preset " + c.preset})
		require.NoError(t, err)
		if c.fp8 && cfg.HasMTP() { // made up front and held, as the CPU path does
			require.NoError(t, dummy.Fill(3))
			assert.Equal(t, dummy.TensorBytes(), dummy.ResidentBytes())
		}
		fills := dummy.Fills()
		assert.True(t, dummy.Generated())
		assert.False(t, disk.Generated())
		assert.Equal(t, safetensors.Generated, dummy.WeightsMode())
		assert.Equal(t, disk.Names(), dummy.Names(), c.preset)
		wantCfg, gotCfg := *disk.Config(), *dummy.Config()
		wantCfg.Source, gotCfg.Source = "", ""
		assert.Equal(t, wantCfg, gotCfg, c.preset)
		require.NoError(t, dummy.Validate())
		if cfg.HasMTP() {
			require.NoError(t, dummy.ValidateMTP())
		}
		for _, name := range disk.Names() {
			want, wi, err := disk.Raw(name)
			require.NoError(t, err)
			got, gi, err := dummy.Raw(name)
			require.NoError(t, err)
			assert.Equal(t, wi.DType, gi.DType, name)
			assert.Equal(t, wi.Shape, gi.Shape, name)
			if !assert.True(t, string(want) == string(got), "%s %s: bytes differ", c.preset, name) {
				break
			}
			dummy.Release(name)
		}
		if fills > 0 {
			assert.Equal(t, fills, dummy.Fills(), "made once, up front")
			assert.Equal(t, dummy.TensorBytes(), dummy.ResidentBytes(), "held by Fill")
		} else {
			assert.Zero(t, dummy.ResidentBytes(), "every tensor released")
		}
		require.NoError(t, disk.Close())
		require.NoError(t, dummy.Close())
	}
}

// TestDummyLazyRelease: nothing is generated until read; an FP8 weight and
// its scale are generated once together; a released tensor is freed and
// generated again (the same bytes) when read again; a held one is not
// freed by another reader's release; concurrent readers see one fill.
func TestDummyLazyRelease(t *testing.T) {
	cfg, err := Preset("tiny")
	require.NoError(t, err)
	ck, err := Dummy(cfg, DummyOptions{Seed: 1, FP8: true, Source: "dummy weights (random, seed 1) of preset tiny"})
	require.NoError(t, err)
	defer ck.Close()
	require.NoError(t, ck.Validate())
	assert.Zero(t, ck.Fills(), "validating generates nothing")
	assert.Zero(t, ck.ResidentBytes())

	var fp8 string
	for _, n := range ck.Names() {
		if dt, _ := ck.DType(n); dt == safetensors.F8E4M3 {
			fp8 = n
			break
		}
	}
	require.NotEmpty(t, fp8)
	info, _ := ck.Info(fp8)
	var wg sync.WaitGroup
	first := make([][]byte, 4)
	for i := range first {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _, err := ck.Raw(fp8)
			assert.NoError(t, err)
			first[i] = b
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 1, ck.Fills(), "one fill for concurrent readers")
	si, _ := ck.Info(model.ScaleName(fp8))
	held := info.End - info.Begin + si.End - si.Begin
	assert.Equal(t, held, ck.ResidentBytes())
	_, _, err = ck.FP8Scales(fp8) // the scale came with its weight
	require.NoError(t, err)
	assert.EqualValues(t, 1, ck.Fills())
	want := string(first[0])
	for range 3 {
		ck.Release(fp8)
	}
	assert.Equal(t, held, ck.ResidentBytes(), "one hold left")
	assert.Equal(t, want, string(first[0]), "a held slice stays valid")
	ck.Release(fp8)
	assert.Zero(t, ck.ResidentBytes(), "the last hold released")
	ck.Release(fp8) // unmatched: nothing happens
	again, _, err := ck.Raw(fp8)
	require.NoError(t, err)
	assert.EqualValues(t, 2, ck.Fills())
	assert.Equal(t, want, string(again), "generated again, the same bytes")

	// Float32 takes and gives back its own hold.
	before := ck.Fills()
	_, err = ck.Float32("model.language_model.embed_tokens.weight")
	require.NoError(t, err)
	assert.Equal(t, before+1, ck.Fills())
	assert.Equal(t, held, ck.ResidentBytes(), "the embedding is freed after its float32 copy")
	require.NoError(t, ck.CheckTensors())
}

func TestDummyRefusals(t *testing.T) {
	cfg, err := Preset("tiny")
	require.NoError(t, err)
	_, err = Dummy(nil, DummyOptions{Source: "x"})
	assert.ErrorContains(t, err, "nil config")
	_, err = Dummy(cfg, DummyOptions{})
	assert.ErrorContains(t, err, "source description")
	bad := cfg.Clone()
	bad.HiddenSize = 0
	_, err = Dummy(bad, DummyOptions{Source: "x"})
	assert.Error(t, err)
}

// Fill while readers read and release: every reader sees the bytes of a
// dummy read alone, and once Fill returns every tensor is held (run with
// -race).
func TestDummyFillWhileReading(t *testing.T) {
	cfg, err := Preset("tiny")
	require.NoError(t, err)
	o := DummyOptions{Seed: 5, FP8: true, Source: "dummy weights (random, seed 5) of preset tiny"}
	ref, err := Dummy(cfg, o)
	require.NoError(t, err)
	defer ref.Close()
	ck, err := Dummy(cfg, o)
	require.NoError(t, err)
	defer ck.Close()
	names := ck.Names()
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(names); i += 3 {
				got, _, err := ck.Raw(names[i])
				assert.NoError(t, err)
				want, _, err := ref.Raw(names[i])
				assert.NoError(t, err)
				assert.Equal(t, want, got, names[i])
				ck.Release(names[i])
			}
		}()
	}
	require.NoError(t, ck.Fill(2))
	wg.Wait()
	assert.Equal(t, ck.TensorBytes(), ck.ResidentBytes(), "every tensor held by Fill")
}
