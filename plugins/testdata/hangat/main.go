// Command hangat is a pass plugin that hangs where GLMFLASH_TEST_HANG_AT
// says: "start" (before the handshake, with a child process holding its
// output, as a wrapper script without exec does), "describe", "eligible"
// or "apply". Anything else: it works (and fires nowhere). With
// GLMFLASH_TEST_SETSID=1 it first starts a child in a session of its own
// (setsid: outside the process group the host kills), which sleeps.
package main

import (
	"context"
	"os"
	"os/exec"
	"syscall"

	"github.com/hashicorp/go-plugin"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/plugins/protocol"
	"github.com/glmflash/glmflash/plugins/sdk"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
)

var at = os.Getenv("GLMFLASH_TEST_HANG_AT")

type hang struct{}

var description = pass.Description{Name: "hang-at-test", Version: "0.0.1", Summary: "hangs where GLMFLASH_TEST_HANG_AT says"}

// hangDescribe is the SDK's server but for Describe, which never answers.
type hangDescribe struct{ pb.PassPluginServer }

func (hangDescribe) Describe(context.Context, *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	select {}
}
func (hang) Eligible(*ir.Graph, *pass.Analyses, *pass.Env) []pass.Site {
	if at == "eligible" {
		select {}
	}
	return []pass.Site{{Where: "graph", Layer: -1, OK: true}}
}
func (hang) Apply(*ir.Graph, []pass.Site) (pass.Result, error) {
	if at == "apply" {
		select {}
	}
	return pass.Result{}, nil
}

func main() {
	if os.Getenv("GLMFLASH_TEST_SETSID") == "1" {
		child := exec.Command("sleep", "3600")
		child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := child.Start(); err != nil {
			panic(err)
		}
	}
	if at == "start" {
		child := exec.Command("sleep", "3600")
		child.Stdout, child.Stderr = os.Stdout, os.Stderr // holds the pipes go-plugin reads
		child.Start()
		select {}
	}
	if at == "describe" {
		plugin.Serve(&plugin.ServeConfig{HandshakeConfig: protocol.Handshake,
			VersionedPlugins: protocol.PluginSets(protocol.Versions, hangDescribe{sdk.NewServer(description, hang{})}),
			GRPCServer:       plugin.DefaultGRPCServer})
		return
	}
	sdk.Serve(description, hang{})
}
