package engine

import (
	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
)

// Setup is what FromConfig takes beside the configuration: the model and
// the dtypes of its weights (what pass eligibility reads), the pass
// pipeline (built by the caller from the same configuration: plugin passes
// run in processes started above the engine; nil: the graphs as built),
// the sizes a command chooses, and what a command's own flags add to the
// backend.
type Setup struct {
	Model    *model.Config
	Weights  pass.WeightInfo
	Pipeline *pass.Pipeline
	// Slots, Rollback and MaxPositions are Options' (0: their defaults).
	Slots, Rollback, MaxPositions int
	// ProfileOps times every op on the device (bench --profile-ops).
	ProfileOps bool
	// DFlash is the DFlash drafter (speculative.method dflash, opened from
	// speculative.draft_model by the caller): Options.DFlash.
	DFlash DraftModel
}

// FromConfig is the options of an engine as configuration c and s say:
// c's device; the backend's options (c's precision; c's CUDA section and
// s's flags as cuda.Options); s's pass pipeline with c's eligibility
// environment (topology, LoRA targets, hidden-state captures) for s's
// model and weights; s's sizes. Every command that builds an engine from configuration builds its
// options here.
func FromConfig(c *config.Config, s Setup) Options {
	o := Options{
		Slots: s.Slots, Rollback: s.Rollback, MaxPositions: s.MaxPositions, DFlash: s.DFlash, PageTokens: c.Runtime.KVPageTokens, KVDType: backend.KVDType(c.Runtime.KVDType),
		Device:  c.Device,
		TP:      c.Parallel.TPSize,
		Backend: backend.Options{Precision: c.Precision},
	}
	co := cuda.Options{GraphMaxTokens: c.CUDA.GraphMaxTokens, MaxGraphs: c.CUDA.MaxGraphs, ProfileOps: s.ProfileOps, GEMM: cuda.GEMMOptions{GemvFP8Kernel: c.CUDA.GemvFP8Kernel}}
	if b := c.CUDA.GraphTokenBuckets; len(b) == 0 && c.Device == "cuda" || len(b) == 1 && b[0] == 0 {
		// unset: off until make test-gpu has proven them on hardware (the
		// emulator has; the padding rows' shared slot has not been run on
		// an H200): cuda.graph_token_buckets turns them on
		co.NoGraphBuckets = true
	} else {
		co.GraphBuckets = b
	}
	if !co.IsZero() {
		o.Backend.Device = co
	}
	if s.Pipeline != nil {
		o.Passes = s.Pipeline
		o.PassEnv = c.PassEnv(s.Model, s.Weights)
		o.PassEnv.Device = c.Device    // the engine sets its backend's name per program
		o.Parity = ParityFromConfig(c) // plugin passes are checked at load (parity.go)
	}
	return o
}
