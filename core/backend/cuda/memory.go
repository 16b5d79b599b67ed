package cuda

import (
	"fmt"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/model"
)

// FreeMemory is the device memory free for allocation and in all
// (cuMemGetInfo), after whatever this process and others hold: the
// weights, the workspace and the captured graphs so far
// (backend.MemoryReporter).
func (b *Backend) FreeMemory() (free, total int64, err error) {
	err = b.dev.Do(func() error {
		var err error
		free, total, err = b.dev.MemInfo()
		return err
	})
	return free, total, err
}

// StoreCost is what NewStore(cfg, layers, o) allocates, per page id, per
// slot and once, o's Slots and Pages aside (backend.StoreSizer): per page
// the latent page of every DSA layer (in the kv dtype) and the pooled-key
// page of every own indexer; per slot its page table row (⌈MaxPositions /
// P⌉ ids), every KDA layer's conv window and recurrent state, every
// indexer's pending pool, with a rollback depth the record's buffers, and
// the MTP indexer's saved selection. TestStoreCostIsWhatNewStoreAllocates
// holds it to NewStore.
func (b *Backend) StoreCost(cfg *model.Config, layers []int, o backend.StoreOptions) (backend.StoreCost, error) {
	if o.MaxPositions < 1 {
		return backend.StoreCost{}, fmt.Errorf("cuda: a store needs a positive context limit, got %d", o.MaxPositions)
	}
	if err := cache.CheckLayers(cfg, layers); err != nil {
		return backend.StoreCost{}, err
	}
	if o.Rollback < 0 {
		return backend.StoreCost{}, fmt.Errorf("cuda: rollback depth must be ≥ 0, got %d", o.Rollback)
	}
	P, err := cache.PageTokens(cfg, o.PageTokens)
	if err != nil {
		return backend.StoreCost{}, err
	}
	kd, err := backend.ParseKVDType(string(o.KVDType))
	if err != nil {
		return backend.StoreCost{}, fmt.Errorf("cuda: kv dtype: %w", err)
	}
	el := int64(4)
	if kd == backend.KVBF16 || kd == backend.KVAuto && b.opts.Precision == backend.BF16 {
		el = 2
	}
	depth := int64(o.Rollback)
	c := backend.StoreCost{SlotBytes: 4 * int64((o.MaxPositions+P-1)/P)}
	var roll int64 // a slot's rollback records (the padding slot has none)
	for _, l := range layers {
		if cfg.IsKDA(l) {
			conv, state := int64(cfg.KDAConvLen()), int64(cfg.KDAStateLen())
			c.SlotBytes += 4 * (max(conv, 1) + state)
			if depth > 0 {
				roll += 4 * (max(depth*conv, 1) + depth*state)
			}
			continue
		}
		c.PageBytes += el * int64(P) * int64(cfg.KVLoraRank)
		if cfg.HasOwnIndexer(l) {
			kp, di := int64(cfg.IndexKPool), int64(cfg.IndexHeadDim)
			c.PageBytes += 4 * int64(P) / kp * di
			c.SlotBytes += 2 * 4 * kp * di
			if depth > 0 {
				roll += 2 * 4 * (kp - 1 + depth) * di
			}
			if cfg.IsMTP(l) {
				c.SlotBytes += 4 * int64(cfg.IndexTopK+cfg.IndexKPool-1)
			}
		}
	}
	if b.bucketsOn() { // the padding slot (its state, no rollback records) and scratch page of bucket graphs
		c.FixedBytes += c.SlotBytes + c.PageBytes
	}
	c.SlotBytes += roll
	return c, nil
}
