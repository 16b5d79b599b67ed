package wire

import (
	"testing"

	"github.com/glmflash/glmflash/core/ir"
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

// The graph's typed properties cross the wire as protocol version 1 has
// always spelt them, graph attributes mode (a string) and mtp_layer (an
// int), and come back typed; a mode the engine does not know is refused.
func TestGraphPropertiesCrossAsAttributes(t *testing.T) {
	g := ir.New("t")
	x := g.AddInput(ir.InputHidden, ir.F32, ir.DimT, 4)
	g.Outputs["y"] = g.Op1(ir.OpSigmoid, 8, nil, x)
	g.SetMode(ir.ModeVerify)
	g.SetMTPLayer(8)
	g.Attrs.Put(ir.GraphAttrLogits.Is("spans"))
	e, err := EncodeGraph(g)
	require.NoError(t, err)
	attrs, err := DecodeAttrs(e.Graph.GetAttrs())
	require.NoError(t, err)
	require.Equal(t, map[string]any{"logits": "spans", "mode": "verify", "mtp_layer": 8}, attrs)

	back, err := DecodeGraph(e.Graph)
	require.NoError(t, err)
	require.Equal(t, ir.ModeVerify, back.Mode())
	l, mtp := back.MTPLayer()
	require.True(t, mtp)
	require.Equal(t, 8, l)
	require.Equal(t, ir.Attrs{"logits": "spans"}, back.Attrs)
	require.Equal(t, g.Text(), back.Text())
	require.Equal(t, pass.DraftGraph, pass.KindOf(back))

	for _, a := range e.Graph.Attrs {
		if a.Key == ir.GraphAttrMode {
			a.Value = &pb.AttrValue{Value: &pb.AttrValue_Str{Str: "sideways"}}
		}
	}
	_, err = DecodeGraph(e.Graph)
	require.ErrorContains(t, err, `graph: graph attribute mode: unknown mode "sideways"`)
}

// A DFlash draft graph crosses too: its context dimension C and the typed
// dflash property (a graph attribute dflash=true on the wire) come back as
// they were, and it is a draft graph on both sides.
func TestDFlashGraphCrosses(t *testing.T) {
	g := ir.New("dflash")
	x := g.AddInput(ir.InputContext, ir.F32, ir.DimC, 8)
	g.Outputs["y"] = g.Op1(ir.OpSigmoid, -1, nil, x)
	g.SetMode(ir.ModeExtend)
	g.SetDFlash()
	e, err := EncodeGraph(g)
	require.NoError(t, err)
	attrs, err := DecodeAttrs(e.Graph.GetAttrs())
	require.NoError(t, err)
	require.Equal(t, map[string]any{"mode": "extend", "dflash": true}, attrs)
	back, err := DecodeGraph(e.Graph)
	require.NoError(t, err)
	require.True(t, back.DFlash())
	require.Equal(t, []int{ir.DimC, 8}, back.Input(ir.InputContext).Shape)
	require.Equal(t, g.Text(), back.Text())
	require.Equal(t, pass.DraftGraph, pass.KindOf(back))
}
