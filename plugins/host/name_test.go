package host

import (
	"context"
	"testing"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/plugins/sdk"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// renamed is a plugin's client whose Describe answers with another name.
type renamed struct {
	pb.PassPluginClient // the methods this test does not call
	srv                 pb.PassPluginServer
	name                string
}

func (r renamed) Describe(ctx context.Context, in *pb.DescribeRequest, _ ...grpc.CallOption) (*pb.DescribeResponse, error) {
	d, err := r.srv.Describe(ctx, in)
	if err == nil {
		d.Name = r.name
	}
	return d, err
}

type noop struct{}

func (noop) Eligible(*ir.Graph, *pass.Analyses, *pass.Env) []pass.Site { return nil }
func (noop) Apply(*ir.Graph, []pass.Site) (pass.Result, error)         { return pass.Result{}, nil }

// The name a plugin declares follows the rules of built-in pass names
// (issue 37: any name was taken, "../x" and spaces included).
func TestPluginPassNameIsValidated(t *testing.T) {
	d := pass.Description{Name: "name-test", Version: "0.0.1", Summary: "does nothing", Verify: "not eligible", Draft: "not eligible"}
	srv := sdk.NewServer(d, noop{})
	p, err := Connect(renamed{srv: srv, name: "name-test"}, Options{Log: zerolog.Nop()})
	require.NoError(t, err)
	require.Equal(t, "name-test", p.Name)
	for _, bad := range []string{"../escape", "Upper", "has space", "x|y", "double--hyphen", "-lead", "trail-", "9lives", "é", string(make([]byte, 65))} {
		_, err := Connect(renamed{srv: srv, name: bad}, Options{Log: zerolog.Nop()})
		require.Error(t, err, "%q", bad)
		require.ErrorContains(t, err, "invalid description: pass name", "%q", bad)
	}
	long := "a"
	for len(long) <= pass.MaxNameLength {
		long += "b"
	}
	_, err = Connect(renamed{srv: srv, name: long}, Options{Log: zerolog.Nop()})
	require.ErrorContains(t, err, "more than 64")
}
