package cpu

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/model"
)

// Meminfo reads the host's memory report (/proc/meminfo); tests replace it
// (the memory planner's injection point on the CPU).
var Meminfo = func() ([]byte, error) { return os.ReadFile("/proc/meminfo") }

// FreeMemory is the host memory available to new allocations without
// swapping, MemAvailable of /proc/meminfo, and MemTotal
// (backend.MemoryReporter): the weights this process already holds are
// not in it.
func (b *Backend) FreeMemory() (free, total int64, err error) {
	text, err := Meminfo()
	if err != nil {
		return 0, 0, fmt.Errorf("cpu: reading the host's memory: %w", err)
	}
	return ParseMeminfo(text)
}

// ParseMeminfo reads MemAvailable and MemTotal (in kB) from a
// /proc/meminfo text; either missing, malformed or negative is an error.
func ParseMeminfo(text []byte) (avail, total int64, err error) {
	vals := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "MemAvailable" && key != "MemTotal") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("cpu: /proc/meminfo: %s: %q is not a size in kB", key, strings.TrimSpace(rest))
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || v < 0 || v > 1<<53 {
			return 0, 0, fmt.Errorf("cpu: /proc/meminfo: %s: %q is not a size in kB", key, f[0])
		}
		vals[key] = v << 10
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("cpu: /proc/meminfo: %w", err)
	}
	for _, k := range []string{"MemAvailable", "MemTotal"} {
		if _, ok := vals[k]; !ok {
			return 0, 0, fmt.Errorf("cpu: /proc/meminfo has no %s line", k)
		}
	}
	return vals["MemAvailable"], vals["MemTotal"], nil
}

// StoreCost is what a heap store of the given layers holds at most, per
// page id and per slot (backend.StoreSizer): a page's latent and
// pooled-key rows in fp32 (fp8 rows with kv dtype fp8) and its place in the pool's tables; a slot's KDA
// and pending indexer state, its rollback record for o.Rollback positions
// and its page table row. Pages and slots are made on first use, so a
// pool larger than what runs costs nothing until it fills.
func (b *Backend) StoreCost(cfg *model.Config, layers []int, o backend.StoreOptions) (backend.StoreCost, error) {
	if err := cache.CheckLayers(cfg, layers); err != nil {
		return backend.StoreCost{}, err
	}
	if o.Rollback < 0 {
		return backend.StoreCost{}, fmt.Errorf("cpu: rollback depth must be ≥ 0, got %d", o.Rollback)
	}
	P, err := cache.PageTokens(cfg, o.PageTokens)
	if err != nil {
		return backend.StoreCost{}, err
	}
	kv := cache.KVF32
	if o.KVDType == backend.KVFP8 {
		kv = cache.KVFP8
	}
	const pageTables = 4 + 24 // a free-stack id and a buffer slice header per page
	c := backend.StoreCost{PageBytes: cache.PageBytesKV(cfg, layers, P, kv) + pageTables,
		SlotBytes: cache.StateSlotBytes(cfg, layers) + 4*int64((max(o.MaxPositions, 1)+P-1)/P)}
	if o.Rollback > 0 {
		c.SlotBytes += cache.RollbackSlotBytes(cfg, layers, o.Rollback)
	}
	return c, nil
}
