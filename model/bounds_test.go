package model

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every integer field of config.json is bounded: set to a value no machine
// can hold (or to a negative one), it is an error that names the field,
// never an allocation, a hang or a wrap-around.
func TestEveryConfigFieldIsBounded(t *testing.T) {
	data, err := os.ReadFile(fixtureDir + "/config.json")
	require.NoError(t, err)
	base, err := ParseConfig(data, "config.json")
	require.NoError(t, err)
	require.NoError(t, base.Validate())
	base.EOSTokenIDs = []int{1, 2} // the fixture has none; check the field too
	tc := base.TextConfigMap()
	var keys []string
	for k := range tc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	checked := 0
	for _, k := range keys {
		switch tc[k].(type) {
		case int, *int, []int:
		default:
			continue
		}
		if k == "qk_head_dim" || k == "head_dim" {
			continue // derived on output, not read back
		}
		for _, bad := range []any{int64(1) << 40, int64(1e18), -7} {
			m := base.TextConfigMap()
			m[k] = bad
			if _, list := tc[k].([]int); list {
				m[k] = []any{1, bad}
			}
			b, err := json.Marshal(m)
			require.NoError(t, err)
			c, err := ParseConfig(b, "config.json")
			if err == nil {
				err = c.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), k) {
				t.Errorf("%s = %v: want an error naming the field, got %v", k, bad, err)
			}
		}
		checked++
	}
	require.Greater(t, checked, 30, "the test must see the config's integer fields")
}

// The cases the review found: each is an error naming the field.
func TestConfigReviewCases(t *testing.T) {
	data, err := os.ReadFile(fixtureDir + "/config.json")
	require.NoError(t, err)
	for field, val := range map[string]string{
		"index_topk":              "16777216",
		"hc_sinkhorn_iters":       "1000000000",
		"max_position_embeddings": "1000000000000000000",
	} {
		s := strings.Replace(string(data), `"`+field+`": `, `"`+field+`": `+val+`, "x_`+field+`": `, 1)
		c, err := ParseConfig([]byte(s), "config.json")
		require.NoError(t, err)
		err = c.Validate()
		require.Error(t, err, field)
		require.Contains(t, err.Error(), field)
	}
}

// config.json and shards must be regular files: a link to /dev/zero or a
// FIFO is refused at once (no unbounded read, no hang).
func TestCheckpointFilesMustBeRegular(t *testing.T) {
	d := t.TempDir()
	require.NoError(t, os.Symlink("/dev/zero", filepath.Join(d, ConfigFile)))
	_, err := Open(d)
	require.ErrorContains(t, err, "not a regular file")

	d = t.TempDir()
	cfg, err := os.ReadFile(fixtureDir + "/config.json")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(d, ConfigFile), cfg, 0o644))
	require.NoError(t, syscall.Mkfifo(filepath.Join(d, SingleFile), 0o644))
	_, err = Open(d)
	require.ErrorContains(t, err, "not a regular file (a FIFO)")
}
