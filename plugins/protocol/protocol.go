// Package protocol holds what both ends of the plugin boundary must agree
// on: go-plugin's handshake (magic cookie), the protocol versions, the name
// under which the pass is dispensed, and the go-plugin glue that carries
// the PassPlugin gRPC service (proto/glmflash/plugin/v1).
package protocol

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
)

// The magic cookie keeps a plugin binary from doing anything when it is run
// by hand (it prints a notice and exits): it is not a security measure.
const (
	MagicCookieKey   = "GLMFLASH_PASS_PLUGIN"
	MagicCookieValue = "7d0c3f4e-glmflash-pass-plugin"
)

// PluginName is the key under which the pass is dispensed.
const PluginName = "pass"

// FilePrefix starts the file name of every plugin executable.
const FilePrefix = "glmflash-pass-"

// The environment the host gives a plugin process, beside go-plugin's.
const (
	// EnvDir is the directory the plugin file was found in, and EnvPath its
	// path. The host runs the bytes it verified from a sealed memory file
	// (/proc/self/fd/3 on Linux), so "$0" is not the file's path: a wrapper
	// script finds the files beside it through "$GLMFLASH_PLUGIN_DIR", not
	// "$(dirname "$0")". What the wrapper then runs is not verified by the
	// host (only the wrapper is).
	EnvDir  = "GLMFLASH_PLUGIN_DIR"
	EnvPath = "GLMFLASH_PLUGIN_PATH"
	// EnvParentFD is the descriptor of the read end of a pipe whose only
	// write end the host holds: it reads end of file when the host exits,
	// however it dies (SIGKILL, SIGPIPE). The SDK then kills the plugin's
	// descendants and exits.
	EnvParentFD = "GLMFLASH_PLUGIN_PARENT_FD"
)

// Versions are the protocol versions this build speaks, oldest first. The
// host offers all of them and the plugin serves all of them; go-plugin picks
// the highest common one. Version 1 is proto/glmflash/plugin/v1.
var Versions = []int{1}

// Handshake is go-plugin's handshake. ProtocolVersion is the fallback for
// peers that do not negotiate; negotiation uses VersionedPlugins.
var Handshake = plugin.HandshakeConfig{ProtocolVersion: 1, MagicCookieKey: MagicCookieKey, MagicCookieValue: MagicCookieValue}

// GRPCPass is the go-plugin plugin carrying the PassPlugin service. Impl is
// set on the plugin side only.
type GRPCPass struct {
	plugin.NetRPCUnsupportedPlugin
	Impl pb.PassPluginServer
}

// GRPCServer registers the service (plugin side).
func (p *GRPCPass) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterPassPluginServer(s, p.Impl)
	return nil
}

// GRPCClient returns the service client (host side).
func (p *GRPCPass) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return pb.NewPassPluginClient(c), nil
}

// PluginSets maps each version to the plugin set serving it.
func PluginSets(versions []int, impl pb.PassPluginServer) map[int]plugin.PluginSet {
	m := map[int]plugin.PluginSet{}
	for _, v := range versions {
		m[v] = plugin.PluginSet{PluginName: &GRPCPass{Impl: impl}}
	}
	return m
}
