// Command unknownop is a pass plugin written without the SDK (raw PassPlugin
// service) whose Apply returns a graph in which the LM head's op is renamed
// to one the engine has not registered.
package main

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/protobuf/proto"

	"github.com/glmflash/glmflash/plugins/protocol"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
)

type srv struct {
	pb.UnimplementedPassPluginServer
}

func (srv) Describe(context.Context, *pb.DescribeRequest) (*pb.DescribeResponse, error) {
	return &pb.DescribeResponse{Name: "unknown-op-test", Version: "0.0.1", Summary: "returns a graph with an op the engine does not know"}, nil
}

func (srv) Configure(context.Context, *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	return &pb.ConfigureResponse{}, nil
}

func (srv) Eligible(context.Context, *pb.EligibleRequest) (*pb.EligibleResponse, error) {
	return &pb.EligibleResponse{Sites: []*pb.Site{{Where: "graph", Layer: -1, Ok: true}}}, nil
}

func (srv) Apply(_ context.Context, req *pb.ApplyRequest) (*pb.ApplyResponse, error) {
	g := proto.Clone(req.GetGraph()).(*pb.Graph)
	g.Nodes[len(g.Nodes)-1].Op = "fused_magic_head"
	return &pb.ApplyResponse{Graph: g, Fired: 1}, nil
}

func main() {
	plugin.Serve(&plugin.ServeConfig{HandshakeConfig: protocol.Handshake,
		VersionedPlugins: protocol.PluginSets(protocol.Versions, srv{}), GRPCServer: plugin.DefaultGRPCServer})
}
