// Command badir is a pass plugin written without the SDK (raw PassPlugin
// service) whose Apply returns a graph that fails verification: the last
// node (the LM head) is moved to the front, so it reads a value before that
// value is defined.
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
	return &pb.DescribeResponse{Name: "bad-ir-test", Version: "0.0.1", Summary: "returns a graph that does not verify"}, nil
}

func (srv) Configure(context.Context, *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	return &pb.ConfigureResponse{}, nil
}

func (srv) Eligible(context.Context, *pb.EligibleRequest) (*pb.EligibleResponse, error) {
	return &pb.EligibleResponse{Sites: []*pb.Site{{Where: "graph", Layer: -1, Ok: true}}}, nil
}

func (srv) Apply(_ context.Context, req *pb.ApplyRequest) (*pb.ApplyResponse, error) {
	g := proto.Clone(req.GetGraph()).(*pb.Graph)
	n := len(g.Nodes)
	g.Nodes = append([]*pb.Node{g.Nodes[n-1]}, g.Nodes[:n-1]...)
	return &pb.ApplyResponse{Graph: g, Fired: 1}, nil
}

func main() {
	plugin.Serve(&plugin.ServeConfig{HandshakeConfig: protocol.Handshake,
		VersionedPlugins: protocol.PluginSets(protocol.Versions, srv{}), GRPCServer: plugin.DefaultGRPCServer})
}
