package wire

import (
	"testing"

	"github.com/glmflash/glmflash/core/pass"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
	"github.com/stretchr/testify/require"
)

// Statistics and path options cross the wire unchanged.
func TestStatisticsAndPathOptionsRoundTrip(t *testing.T) {
	st := []pass.Statistic{{Name: "fused", Value: 7, Doc: "layers"}, {Name: "removed", Value: -1}}
	got, err := DecodeStats(EncodeStats(st))
	require.NoError(t, err)
	require.Equal(t, st, got)
	_, err = DecodeStats([]*pb.Statistic{{Name: "a"}, {Name: "a"}})
	require.ErrorContains(t, err, "given twice")
	_, err = DecodeStats([]*pb.Statistic{{}})
	require.ErrorContains(t, err, "empty")

	d := pass.Description{Name: "p", Version: "1", Options: []pass.Option{
		{Name: "dir", Type: pass.PathType, Default: pass.Path("tables"), Doc: "where"},
		{Name: "n", Type: pass.Int, Default: 3}}}
	m, err := EncodeDescription(d)
	require.NoError(t, err)
	dd, err := DecodeDescription(m)
	require.NoError(t, err)
	require.Equal(t, d, dd)
	m.Options[1].Default = &pb.AttrValue{Value: &pb.AttrValue_Str{Str: "three"}}
	_, err = DecodeDescription(m)
	require.ErrorContains(t, err, "option n: default three does not have type int")
	m.Options[1].Type = "map"
	_, err = DecodeDescription(m)
	require.ErrorContains(t, err, `unknown type "map"`)
}
