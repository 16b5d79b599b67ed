// Command crash is a pass plugin that dies mid-call: os.Exit or a panic on
// another goroutine (which no recover can catch), in Eligible or in Apply.
package main

import (
	"os"
	"time"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/plugins/sdk"
)

type crash struct{ mode, at string }

func (*crash) Name() string { return "crash-test" }
func (*crash) Describe() pass.Description {
	return pass.Description{Name: "crash-test", Version: "0.0.1", Summary: "dies mid-call",
		Options: []pass.Option{
			{Name: "mode", Type: pass.String, Default: "exit", Enum: []string{"exit", "panic"}},
			{Name: "at", Type: pass.String, Default: "apply", Enum: []string{"eligible", "apply"}}}}
}
func (c *crash) Configure(o map[string]any) error {
	c.mode, c.at = o["mode"].(string), o["at"].(string)
	return nil
}

func (c *crash) die() {
	sdk.Log().Error("crash-test is about to die", "mode", c.mode, "at", c.at)
	if c.mode == "exit" {
		os.Exit(3)
	}
	go func() { panic("crash-test: deliberate panic") }()
	time.Sleep(time.Minute)
}

func (c *crash) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	if c.at == "eligible" {
		c.die()
	}
	return []pass.Site{{Where: "graph", Layer: -1, OK: true}}
}

func (c *crash) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	c.die()
	return pass.Result{}, nil
}

func main() { sdk.Serve(&crash{}) }
