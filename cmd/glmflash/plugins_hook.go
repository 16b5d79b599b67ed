package main

import (
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/pass"
)

// attachPlugins adds the configured plugin passes to a pipeline (none until
// plugin support exists).
func attachPlugins(pl *pass.Pipeline, ec *config.Engine) error { return nil }
