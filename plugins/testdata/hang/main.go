// Command hang is a pass plugin that never answers Eligible.
package main

import (
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/plugins/sdk"
)

type hang struct{}

var description = pass.Description{Name: "hang-test", Version: "0.0.1", Summary: "hangs in Eligible"}

func (hang) Eligible(*ir.Graph, *pass.Analyses, *pass.Env) []pass.Site {
	sdk.Log().Warn("hang-test: hanging in Eligible")
	select {}
}
func (hang) Apply(*ir.Graph, []pass.Site) (pass.Result, error) { return pass.Result{}, nil }

func main() { sdk.Serve(description, hang{}) }
