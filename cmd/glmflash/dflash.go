package main

import (
	"fmt"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

// openDFlash opens speculative.draft_model's DFlash drafter (its weights
// held as the model's) and checks that it fits the model.
func openDFlash(sp config.Speculative, cfg *model.Config, weights string) (*model.DFlashCheckpoint, error) {
	mode, err := safetensors.ParseMode(weights)
	if err != nil {
		return nil, fmt.Errorf("model.weights: %w", err)
	}
	return model.OpenDFlashFor(sp.DraftModel, cfg, model.OpenOptions{Weights: mode})
}
