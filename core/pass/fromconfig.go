package pass

import (
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/model"
)

// FromConfig builds the pipeline the engine configuration asks for: the
// enabled passes in their listed order.
func FromConfig(e *config.Engine) (*Pipeline, error) {
	var reqs []Request
	for _, p := range e.Enabled() {
		reqs = append(reqs, Request{Name: p.Name, Options: p.Options})
	}
	return NewPipeline(reqs, e.VerifyEachPass())
}

// EnvFromConfig is the eligibility environment for a model, its weights and
// an engine configuration.
func EnvFromConfig(e *config.Engine, m *model.Config, w WeightInfo) *Env {
	env := &Env{Model: m, Weights: w, HostLengths: true, CaptureHidden: map[int]bool{},
		TP: Topology{Size: e.Parallel.AttentionTPSize, Rank: e.Parallel.AttentionTPRank, Known: e.Parallel.AttentionTPSize > 0}}
	for _, a := range e.LoRA.Adapters {
		for _, t := range a.Targets {
			env.LoRA = append(env.LoRA, LoRATarget{Adapter: a.Name, Module: t, Layers: a.Layers})
		}
	}
	for _, l := range e.Debug.CaptureHidden {
		env.CaptureHidden[l] = true
	}
	return env
}

// FromConfigWith is FromConfig with pass names also resolved by extra (the
// plugin host's passes), so plugin passes take their place in the same
// `passes:` list as built-in ones.
func FromConfigWith(e *config.Engine, extra Resolver) (*Pipeline, error) {
	var reqs []Request
	for _, p := range e.Enabled() {
		reqs = append(reqs, Request{Name: p.Name, Options: p.Options})
	}
	return NewPipelineWith(reqs, e.VerifyEachPass(), extra)
}
