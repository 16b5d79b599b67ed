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

type options struct {
	Mode string `option:"mode" default:"exit" enum:"exit,panic"`
	At   string `option:"at" default:"apply" enum:"eligible,apply"`
}

type crash struct{ opts options }

var description = pass.Description{Name: "crash-test", Version: "0.0.1", Summary: "dies mid-call"}

func (c *crash) Options() any { return &c.opts }

func (c *crash) die() {
	sdk.Log().Error("crash-test is about to die", "mode", c.opts.Mode, "at", c.opts.At)
	if c.opts.Mode == "exit" {
		os.Exit(3)
	}
	go func() { panic("crash-test: deliberate panic") }()
	time.Sleep(time.Minute)
}

func (c *crash) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	if c.opts.At == "eligible" {
		c.die()
	}
	return []pass.Site{{Where: "graph", Layer: -1, OK: true}}
}

func (c *crash) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	c.die()
	return pass.Result{}, nil
}

func main() { sdk.Serve(description, &crash{}) }
