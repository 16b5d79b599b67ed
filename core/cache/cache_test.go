package cache

import (
	"os"
	"testing"

	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

func tinyMTP(t *testing.T) *model.Config {
	t.Helper()
	b, err := os.ReadFile("../../testdata/glm5next-tiny-a/checkpoint/config.json")
	require.NoError(t, err)
	cfg, err := model.ParseConfig(b, "tiny-a")
	require.NoError(t, err)
	cfg.NumNextNPredictLayers = 1
	require.NoError(t, cfg.Validate())
	return cfg
}

// A store holds the state of its layers only: the trunk store KDA windows
// and states and DSA latents and pools of layers 0–7, the MTP store the
// latents and pools of layer 8; each reports the others as absent.
func TestStoreHoldsItsLayers(t *testing.T) {
	cfg := tinyMTP(t)
	trunk, err := NewStore(cfg, cfg.TrunkLayers(), 2)
	require.NoError(t, err)
	mtp, err := NewStore(cfg, cfg.MTPLayers(), 2)
	require.NoError(t, err)
	require.Equal(t, []int{8}, mtp.Layers())

	s, err := trunk.Alloc()
	require.NoError(t, err)
	q, err := trunk.Seq(s)
	require.NoError(t, err)
	for l := 0; l < 8; l++ {
		_, _, kerr := q.KDA(l)
		ckv, lerr := q.Latents(l)
		_, ierr := q.Indexer(l)
		if cfg.IsKDA(l) {
			require.NoError(t, kerr)
			require.Error(t, lerr)
		} else {
			require.Error(t, kerr)
			require.NoError(t, lerr)
			require.NotNil(t, ckv)
			require.NoError(t, ierr)
		}
	}
	_, err = q.Latents(8)
	require.ErrorContains(t, err, "no MLA latents for layer 8")

	m, err := mtp.Alloc()
	require.NoError(t, err)
	mq, err := mtp.Seq(m)
	require.NoError(t, err)
	_, err = mq.Latents(8)
	require.NoError(t, err)
	_, err = mq.Indexer(8)
	require.NoError(t, err)
	_, err = mq.Latents(3)
	require.ErrorContains(t, err, "no MLA latents for layer 3")
	_, _, err = mq.KDA(0)
	require.ErrorContains(t, err, "no KDA state for layer 0")
	_, err = mq.Indexer(99)
	require.ErrorContains(t, err, "no indexer state for layer 99")

	// lengths are per store
	require.NoError(t, trunk.Advance(s, 5))
	n, _ := mtp.Len(m)
	require.Zero(t, n)
	require.NoError(t, mtp.Advance(m, 3))
	n, _ = trunk.Len(s)
	require.Equal(t, 5, n)

	// a reused slot starts empty and keeps its layers
	require.NoError(t, mtp.Reserve([]int{m}, []int{3}))
	require.NoError(t, mq.CKV[8].Write(0, make([]float32, 3*cfg.KVLoraRank)))
	mq.CKV[8].Len = 3
	require.NoError(t, mtp.Free(m))
	m2, err := mtp.Alloc()
	require.NoError(t, err)
	mq2, _ := mtp.Seq(m2)
	ckv, err := mq2.Latents(8)
	require.NoError(t, err)
	require.Zero(t, ckv.Len)
	require.Empty(t, ckv.Pages, "Free returned the pages")
	n, _ = mtp.Len(m2)
	require.Zero(t, n)
}

func TestStoreLayerList(t *testing.T) {
	cfg := tinyMTP(t)
	_, err := NewStore(cfg, nil, 1)
	require.ErrorContains(t, err, "at least one layer")
	_, err = NewStore(cfg, []int{3, 3}, 1)
	require.ErrorContains(t, err, "layer 3 is listed twice")
	_, err = NewStore(cfg, []int{9}, 1)
	require.ErrorContains(t, err, "layer 9 is not a layer of the model (8 trunk + 1 MTP layers)")
	_, err = NewStore(cfg, []int{-1}, 1)
	require.Error(t, err)
	_, err = NewStore(cfg, cfg.MTPLayers(), 0)
	require.ErrorContains(t, err, "at least one slot")
}

// The MTP layer's slot costs its latents and pooled keys per token; the
// trunk's bound is unchanged by the MTP layer.
func TestLayerSlotBytes(t *testing.T) {
	cfg := tinyMTP(t)
	plain := cfg.Clone()
	plain.NumNextNPredictLayers = 0
	require.Equal(t, SlotBytes(plain, 100), SlotBytes(cfg, 100))
	require.Equal(t, int64(4*100*(cfg.KVLoraRank+cfg.IndexHeadDim)), LayerSlotBytes(cfg, cfg.MTPLayers(), 100))
}
