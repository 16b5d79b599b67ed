package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Speculative configures speculative decoding (core/speculative, core/sched):
// method off, mtp (the model's MTP layer drafts: the number of draft steps
// directly or as a preset, and index sharing between draft steps) or
// dflash (a DFlash block drafter checkpoint drafts a block per forward:
// its block size and target layers come from its config.json).
type Speculative struct {
	// Method is "off" (plain decoding), "mtp" or "dflash".
	Method string `koanf:"method"`
	// DraftModel is the DFlash drafter's checkpoint directory (method
	// dflash: required; refused with another method).
	DraftModel string `koanf:"draft_model" path:""`
	// Preset is "num_steps-topk-num_draft_tokens": 5-1-6 (low latency),
	// 1-1-2 (balanced) or any chain S-1-(S+1).
	Preset string `koanf:"preset"`
	// NumSteps is the drafts per verify span (0: the preset's; both given
	// must agree).
	NumSteps int `koanf:"num_steps"`
	// IndexShare is index_share_for_mtp_iteration: draft steps ≥ 1 reuse
	// step 0's indexer selection. Unset: the checkpoint's config.json value
	// (true for GLM-5.3-Flash).
	IndexShare *bool `koanf:"index_share"`
	// SimulateAcceptance, when set, pins every verify span's acceptance at
	// this per-draft rate in (0, 1] by a seeded Bernoulli chain whatever the
	// target says (SGLang's SGLANG_SIMULATE_ACC_LEN, as a rate): a way to
	// measure the serving path at a chosen acceptance apart from the
	// weights. It changes outputs, and every report says so. 0 (the
	// default): off, the target's own acceptance.
	SimulateAcceptance float64 `koanf:"simulate_acceptance"`
}

// On reports whether speculative decoding is on.
func (s Speculative) On() bool { return s.Method != "" && s.Method != "off" }

// Steps is the effective num_steps (after Validate; 0 when off, and for
// dflash, whose drafts per span are its drafter's block_size − 1: known
// once the drafter is opened).
func (s Speculative) Steps() int {
	if !s.On() || s.DFlash() {
		return 0
	}
	if s.NumSteps > 0 {
		return s.NumSteps
	}
	p, err := ParseSpecPreset(s.Preset)
	if err != nil {
		return 0
	}
	return p.Steps
}

// DFlash reports method dflash.
func (s Speculative) DFlash() bool { return s.Method == "dflash" }

// Share is the effective index sharing for a checkpoint whose config says
// checkpoint.
func (s Speculative) Share(checkpoint bool) bool {
	if s.IndexShare != nil {
		return *s.IndexShare
	}
	return checkpoint
}

// String describes the setting ("off", "mtp 5-1-6").
func (s Speculative) String() string {
	if !s.On() {
		return "off"
	}
	n := s.Steps()
	str := fmt.Sprintf("%s %d-1-%d", s.Method, n, n+1)
	if s.DFlash() {
		str = "dflash " + s.DraftModel
	}
	if s.SimulateAcceptance > 0 { // the outputs are not the model's: every report says so
		str += fmt.Sprintf(", simulated acceptance %g", s.SimulateAcceptance)
	}
	return str
}

// validate checks the section; preset is model.preset (a -dflash preset
// holds its own drafter: draft_model may then be left empty).
func (s *Speculative) validate(preset string) error {
	if v := s.SimulateAcceptance; v != 0 && !(v > 0 && v <= 1) {
		return keyErr("speculative.simulate_acceptance", "must be a per-draft acceptance rate in (0, 1] (0: off), got %v", v)
	}
	switch s.Method {
	case "", "off":
		s.Method = "off"
		if s.SimulateAcceptance != 0 {
			return keyErr("speculative.simulate_acceptance", "%v needs speculative decoding on (speculative.method is off)", s.SimulateAcceptance)
		}
		if s.DraftModel != "" {
			return keyErr("speculative.draft_model", "is a DFlash drafter's: set speculative.method dflash, or leave it empty")
		}
		return nil
	case "mtp":
		if s.DraftModel != "" {
			return keyErr("speculative.draft_model", "is a DFlash drafter's (method dflash), not method mtp's: leave it empty")
		}
	case "dflash":
		return s.validateDFlash(preset)
	default:
		return keyErr("speculative.method", "must be off, mtp or dflash, got %q", s.Method)
	}
	if s.Preset == "" && s.NumSteps == 0 {
		s.Preset = "5-1-6" // the model card's low-latency preset
	}
	if s.NumSteps < 0 || s.NumSteps > MaxSpecSteps {
		return keyErr("speculative.num_steps", "must be in [1, %d] (0: the preset's), got %d", MaxSpecSteps, s.NumSteps)
	}
	if s.Preset != "" {
		p, err := ParseSpecPreset(s.Preset)
		if err != nil {
			return keyErr("speculative.preset", "%v", err)
		}
		if s.NumSteps != 0 && s.NumSteps != p.Steps {
			return keyErr("speculative.num_steps", "%d disagrees with speculative.preset %s (%d steps): give one of them", s.NumSteps, p.Name, p.Steps)
		}
	}
	return nil
}

// validateDFlash checks method dflash: a drafter directory, and none of
// the MTP keys (the drafter's config.json gives its block and layers).
func (s *Speculative) validateDFlash(preset string) error {
	switch {
	case s.DraftModel == "" && !strings.HasSuffix(preset, DFlashPresetSuffix):
		return keyErr("speculative.draft_model", "method dflash needs the DFlash drafter's checkpoint directory (or a model.preset ending in %s, which writes one)", DFlashPresetSuffix)
	case s.Preset != "":
		return keyErr("speculative.preset", "%q is an MTP chain's: a DFlash drafter's block size comes from its config.json (leave it empty)", s.Preset)
	case s.NumSteps != 0:
		return keyErr("speculative.num_steps", "%d is an MTP chain's: a DFlash drafter drafts block_size − 1 tokens per span (leave it 0)", s.NumSteps)
	case s.IndexShare != nil:
		return keyErr("speculative.index_share", "is index sharing between MTP draft steps: a DFlash drafter has no indexer (leave it unset)")
	}
	return nil
}

// DFlashPresetSuffix ends the model presets that come with a random DFlash
// drafter (randckpt.DFlashSuffix: "tiny-dflash" writes it in <dir>/dflash);
// with one, speculative.draft_model may be left empty.
const DFlashPresetSuffix = "-dflash"

// SpecPreset is a named speculative configuration in SGLang's notation
// "num_steps-topk-num_draft_tokens".
type SpecPreset struct {
	Name string
	// Steps is the draft steps (drafts per verify span); TopK the drafts
	// per step (1: a chain); DraftTokens the verify span's tokens
	// (Steps+1 for a chain: the last accepted token and the drafts).
	Steps, TopK, DraftTokens int
}

// SpecPresets are the named configurations of GLM-5.3-Flash's model card:
// 5-1-6 (low latency) and 1-1-2 (balanced).
var SpecPresets = []SpecPreset{
	{Name: "5-1-6", Steps: 5, TopK: 1, DraftTokens: 6},
	{Name: "1-1-2", Steps: 1, TopK: 1, DraftTokens: 2},
}

// MaxSpecSteps bounds num_steps (spec.MaxSteps is the same bound).
const MaxSpecSteps = 32

// ParseSpecPreset reads "S-K-N": a named preset or any chain S-1-(S+1).
func ParseSpecPreset(s string) (SpecPreset, error) {
	for _, p := range SpecPresets {
		if p.Name == s {
			return p, nil
		}
	}
	f := strings.Split(s, "-")
	if len(f) != 3 {
		return SpecPreset{}, fmt.Errorf("%q is not num_steps-topk-num_draft_tokens (5-1-6, 1-1-2, …)", s)
	}
	var v [3]int
	for i, x := range f {
		n, err := strconv.Atoi(x)
		if err != nil || n < 1 {
			return SpecPreset{}, fmt.Errorf("%q: %q is not a positive integer", s, x)
		}
		v[i] = n
	}
	p := SpecPreset{Name: s, Steps: v[0], TopK: v[1], DraftTokens: v[2]}
	switch {
	case p.Steps > MaxSpecSteps:
		return p, fmt.Errorf("%q: num_steps must be ≤ %d", s, MaxSpecSteps)
	case p.TopK != 1:
		return p, fmt.Errorf("%q: topk must be 1 (chain drafting; tree drafting is not implemented)", s)
	case p.DraftTokens != p.Steps+1:
		return p, fmt.Errorf("%q: num_draft_tokens must be num_steps+1 = %d for a chain", s, p.Steps+1)
	}
	return p, nil
}
