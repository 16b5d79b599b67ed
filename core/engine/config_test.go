package engine

import (
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/require"
)

type dtypes map[string]safetensors.DType

func (d dtypes) DType(name string) (safetensors.DType, bool) { t, ok := d[name]; return t, ok }

// FromConfig takes the device, precision and CUDA section from the
// configuration, the sizes and ProfileOps from the setup, and gives the
// pipeline the configuration's eligibility environment for the model.
func TestFromConfig(t *testing.T) {
	c := config.Default()
	c.Device, c.Precision, c.CUDA.GraphMaxTokens, c.CUDA.GemvFP8Kernel = "cuda", "bf16", -1, "glmf_gemv_f1"
	c.Parallel = config.Parallel{TPSize: 4, AttentionTPSize: 4}
	c.LoRA.Adapters = []config.LoRAAdapter{{Name: "a", Targets: []string{"k_proj"}, Layers: []int{2}}}
	c.Debug.CaptureHidden = []int{3}
	m := &model.Config{HiddenSize: 8}
	w := dtypes{"x": safetensors.F8E4M3}
	pl, err := pass.NewPipelineWith(nil, true, nil)
	require.NoError(t, err)

	o := FromConfig(c, Setup{Model: m, Weights: w, Pipeline: pl, Slots: 3, Rollback: 4, MaxPositions: 5, ProfileOps: true})
	require.Equal(t, "cuda", o.Device)
	// cuda.graph_token_buckets unset: bucket graphs off on the device
	require.Equal(t, backend.Options{Precision: "bf16", Device: cuda.Options{GraphMaxTokens: -1, NoGraphBuckets: true, ProfileOps: true, GEMM: cuda.GEMMOptions{GemvFP8Kernel: "glmf_gemv_f1"}}}, o.Backend)
	require.Equal(t, []int{3, 4, 5}, []int{o.Slots, o.Rollback, o.MaxPositions})
	require.Same(t, pl, o.Passes)
	require.NotNil(t, o.PassEnv)
	require.Same(t, m, o.PassEnv.Model)
	require.Equal(t, safetensors.F8E4M3, o.PassEnv.WeightDType("x"))
	require.Equal(t, pass.Topology{Size: 4, Known: true}, o.PassEnv.TP) // each rank engine sets its rank
	require.Equal(t, 4, o.TP)
	require.Equal(t, []pass.LoRATarget{{Adapter: "a", Module: "k_proj", Layers: []int{2}}}, o.PassEnv.LoRA)
	require.True(t, o.PassEnv.CaptureHidden[3])
	require.Equal(t, "cuda", o.PassEnv.Device)
	require.Nil(t, o.BackendInstance)
	require.Nil(t, o.Hook)

	// the bucket graphs' keys: [0] turns them off, a list is given on
	c.CUDA.GraphTokenBuckets, c.CUDA.MaxGraphs = []int{0}, 7
	co := FromConfig(c, Setup{}).Backend.Device.(cuda.Options)
	require.True(t, co.NoGraphBuckets)
	require.Nil(t, co.GraphBuckets)
	require.Equal(t, 7, co.MaxGraphs)
	c.CUDA.GraphTokenBuckets = []int{128, 1024}
	co = FromConfig(c, Setup{}).Backend.Device.(cuda.Options)
	require.False(t, co.NoGraphBuckets)
	require.Equal(t, []int{128, 1024}, co.GraphBuckets)

	// without a pipeline: the graphs as built, no environment
	o = FromConfig(config.Default(), Setup{})
	require.Equal(t, "cpu", o.Device)
	require.Equal(t, backend.Options{Precision: "fp32"}, o.Backend)
	require.Nil(t, o.Passes)
	require.Nil(t, o.PassEnv)
}
