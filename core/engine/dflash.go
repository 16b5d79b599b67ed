package engine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

// DraftModel is a DFlash drafter an engine runs beside its trunk: its
// configuration and its tensors, named as z-lab's state dict names them
// (*model.DFlashCheckpoint implements it).
type DraftModel interface {
	DFlashConfig() *model.DFlashConfig
	plan.Weights
}

// draftWeights is the weight source of an engine with a drafter: names
// under graph.DFlashPrefix are the drafter's (the prefix removed), every
// other the trunk's, so that the draft graph reads the trunk's embedding
// and lm_head from the trunk's copy.
type draftWeights struct {
	trunk plan.Weights
	draft plan.Weights
}

func (w *draftWeights) route(name string) (plan.Weights, string) {
	if rest, ok := strings.CutPrefix(name, graph.DFlashPrefix); ok {
		return w.draft, rest
	}
	return w.trunk, name
}

// Float32 reads a tensor from the drafter or the trunk.
func (w *draftWeights) Float32(name string, shape ...int) ([]float32, error) {
	src, n := w.route(name)
	return src.Float32(n, shape...)
}

// CheckWeights checks both sources (those that can tell).
func (w *draftWeights) CheckWeights() error {
	var errs []error
	for _, s := range []plan.Weights{w.trunk, w.draft} {
		if c, ok := s.(plan.CheckedWeights); ok {
			errs = append(errs, c.CheckWeights())
		}
	}
	return errors.Join(errs...)
}

// DropResident advises both sources (those that map files).
func (w *draftWeights) DropResident() error {
	var errs []error
	for _, s := range []plan.Weights{w.trunk, w.draft} {
		if d, ok := s.(interface{ DropResident() error }); ok {
			errs = append(errs, d.DropResident())
		}
	}
	return errors.Join(errs...)
}

// rawDraftWeights is draftWeights over two sources that hand out stored
// bytes: the backends then read both checkpoints' tensors as stored.
type rawDraftWeights struct{ draftWeights }

// Raw returns a tensor's stored bytes from the drafter or the trunk.
func (w *rawDraftWeights) Raw(name string) ([]byte, safetensors.TensorInfo, error) {
	src, n := w.route(name)
	return src.(plan.RawWeights).Raw(n)
}

// FP8Scales returns an FP8 tensor's block scales from its source.
func (w *rawDraftWeights) FP8Scales(name string) ([]float32, [2]int, error) {
	src, n := w.route(name)
	return src.(plan.RawWeights).FP8Scales(n)
}

// withDraft is the engine's weight source for a trunk source and a
// drafter.
func withDraft(trunk plan.Weights, d DraftModel) plan.Weights {
	dw := draftWeights{trunk: trunk, draft: d}
	_, tr := trunk.(plan.RawWeights)
	_, dr := d.(plan.RawWeights)
	if tr && dr {
		return &rawDraftWeights{dw}
	}
	return &dw
}

// DFlash is the engine's drafter configuration (nil without one).
func (e *Engine) DFlash() *model.DFlashConfig {
	if e.opts.DFlash == nil {
		return nil
	}
	return e.opts.DFlash.DFlashConfig()
}

// DraftStore returns the DFlash drafter's store (per sequence the K/V
// rows of its draft layers at the context positions it has run), making it
// on first use with the trunk store's slot count and context limit. The
// drafter allocates a draft slot beside each trunk slot it drafts for.
func (e *Engine) DraftStore() (backend.Store, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.draftStoreLocked()
}

func (e *Engine) draftStoreLocked() (backend.Store, error) {
	if e.draftStore != nil {
		return e.draftStore, nil
	}
	if e.be == nil {
		return nil, fmt.Errorf("engine: closed")
	}
	d := e.DFlash()
	if d == nil {
		return nil, fmt.Errorf("engine: no DFlash drafter (speculative.draft_model)")
	}
	if e.opts.Planned && e.store == nil {
		return nil, fmt.Errorf("engine: the DFlash draft store is sized by the memory plan: PlanMemory first")
	}
	ds, ok := e.be.(backend.DraftStorer)
	if !ok {
		return nil, fmt.Errorf("engine: device %s keeps no DFlash draft state (its backend has no draft store)", e.be.Name())
	}
	st, err := ds.NewDraftStore(d.NumHiddenLayers, d.KVWidth(), e.opts.storeOptions())
	if err != nil {
		return nil, fmt.Errorf("engine: DFlash draft store: %w", err)
	}
	e.draftStore = st
	return st, nil
}
