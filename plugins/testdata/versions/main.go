// Command versions is a no-op pass plugin serving the protocol versions
// listed in GLMFLASH_TEST_PLUGIN_VERSIONS (e.g. "1,2"), for negotiation tests.
package main

import (
	"os"
	"strconv"
	"strings"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/plugins/sdk"
)

type noop struct{}

var description = pass.Description{Name: "versions-test", Version: "0.0.1", Summary: "does nothing"}

func (noop) Eligible(*ir.Graph, *pass.Analyses, *pass.Env) []pass.Site {
	return []pass.Site{pass.Skip("graph", -1, "this pass never fires")}
}
func (noop) Apply(*ir.Graph, []pass.Site) (pass.Result, error) { return pass.Result{}, nil }

func main() {
	var vs []int
	for _, s := range strings.Split(os.Getenv("GLMFLASH_TEST_PLUGIN_VERSIONS"), ",") {
		if v, err := strconv.Atoi(strings.TrimSpace(s)); err == nil {
			vs = append(vs, v)
		}
	}
	sdk.ServeWith(description, noop{}, sdk.Options{Versions: vs})
}
