package ir

import "fmt"

// Mode is the kind of batch a graph is built for. Every mode runs on a
// ragged batch of sequences; they differ in which KDA algorithm the graph
// asks for. It is a typed property of the graph (Graph.Mode); the text
// format and the plugin protocol spell it as the graph attribute "mode".
type Mode uint8

// Batch modes.
const (
	ModeUnset   Mode = iota // not stated (a graph not built by core/graph)
	ModePrefill             // fresh sequences, many tokens each (chunked KDA)
	ModeDecode              // one token per sequence on an existing cache (recurrent KDA)
	ModeExtend              // several tokens per sequence on an existing cache (chunked KDA)
	ModeMixed               // any mix; KDA picks per sequence (continuous batching)
	// ModeVerify is a continuous batch holding speculative verify spans (a
	// sequence's last accepted token and its drafts) beside decode and
	// prefill spans. KDA picks per sequence as in ModeMixed; a span run
	// under a rollback checkpoint (backend.Store.Checkpoint) runs the
	// recurrent form and keeps every position's state. Its positions come
	// from the previous step's acceptance (and, for the MTP layer's draft
	// extend, its lengths too): the scheduler never prepares such a batch
	// ahead of the acceptance it depends on (its host lengths are exact
	// when it runs, so host-length-reuse applies).
	ModeVerify
)

var modeNames = [...]string{ModeUnset: "", ModePrefill: "prefill", ModeDecode: "decode", ModeExtend: "extend", ModeMixed: "mixed", ModeVerify: "verify"}

// String is the mode's name ("" for ModeUnset).
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Valid reports whether m is one of the batch modes (not ModeUnset).
func (m Mode) Valid() bool { return m > ModeUnset && int(m) < len(modeNames) }

// ParseMode reads a mode's name.
func ParseMode(s string) (Mode, error) {
	for m, name := range modeNames {
		if m > 0 && name == s {
			return Mode(m), nil
		}
	}
	return ModeUnset, fmt.Errorf("unknown mode %q (want prefill, decode, extend, mixed or verify)", s)
}

// MarshalText spells the mode by name (JSON, YAML).
func (m Mode) MarshalText() ([]byte, error) {
	if m != ModeUnset && !m.Valid() {
		return nil, fmt.Errorf("invalid mode %d", int(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText reads a mode's name ("" is ModeUnset).
func (m *Mode) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*m = ModeUnset
		return nil
	}
	v, err := ParseMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// The graph properties' names in the text format and on the plugin wire
// (graph attributes there: HeaderAttrs, SetHeaderAttrs).
const (
	GraphAttrMode     = "mode"
	GraphAttrMTPLayer = "mtp_layer"
)

// Graph attributes (Graph.Attrs), declared as ops declare theirs: the
// verifier rejects others, or values of another type.
var (
	GraphAttrLayers     = Attr[int]{"layers"}
	GraphAttrLogits     = Attr[string]{"logits"}
	GraphAttrIndexShare = Attr[int]{"index_share"}
)

// GraphAttrs declares the graph attributes.
var GraphAttrs = []AttrDef{
	GraphAttrLayers.Optional("the model's decoder layers (the trunk's graph)"),
	GraphAttrLogits.Optional(`which rows get logits: "all", "last" or "spans"`),
	GraphAttrIndexShare.Optional("index_share_for_mtp_iteration's draft steps (the MTP graph; absent: off)"),
}

// Mode is the batch mode the graph was built for.
func (g *Graph) Mode() Mode { return g.mode }

// SetMode states the batch mode the graph is built for.
func (g *Graph) SetMode(m Mode) { g.mode = m }

// MTPLayer is the MTP (NextN) layer the graph computes, and whether it is
// an MTP graph (speculative decoding's draft graph) at all.
func (g *Graph) MTPLayer() (int, bool) { return g.mtpLayer, g.isMTP }

// SetMTPLayer makes the graph the MTP layer l's graph.
func (g *Graph) SetMTPLayer(l int) { g.mtpLayer, g.isMTP = l, true }

// HeaderAttrs returns the graph's attributes with its typed properties in
// their string encoding (mode, mtp_layer): what the text format prints in
// the graph's header and the plugin protocol carries as graph attributes.
func (g *Graph) HeaderAttrs() Attrs {
	a := g.Attrs.Clone()
	if g.mode != ModeUnset {
		a[GraphAttrMode] = g.mode.String()
	}
	if g.isMTP {
		a[GraphAttrMTPLayer] = g.mtpLayer
	}
	if g.isDFlash {
		a[GraphAttrDFlash] = true
	}
	return a
}

// SetHeaderAttrs is HeaderAttrs' inverse: it sets the typed properties
// from their encoding in a and the graph's attributes to the rest.
func (g *Graph) SetHeaderAttrs(a Attrs) error {
	rest := a.Clone()
	mode, mtp, isMTP := ModeUnset, 0, false
	if v, ok := rest[GraphAttrMode]; ok {
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("graph attribute %s is %T, want a string", GraphAttrMode, v)
		}
		m, err := ParseMode(s)
		if err != nil {
			return fmt.Errorf("graph attribute %s: %w", GraphAttrMode, err)
		}
		mode = m
		delete(rest, GraphAttrMode)
	}
	if v, ok := rest[GraphAttrMTPLayer]; ok {
		l, ok := v.(int)
		if !ok || l < 0 {
			return fmt.Errorf("graph attribute %s is %s, want a layer ≥ 0", GraphAttrMTPLayer, formatAttr(v))
		}
		mtp, isMTP = l, true
		delete(rest, GraphAttrMTPLayer)
	}
	isDFlash := false
	if v, ok := rest[GraphAttrDFlash]; ok {
		b, ok := v.(bool)
		if !ok || !b {
			return fmt.Errorf("graph attribute %s is %s, want true (absent: not a DFlash draft graph)", GraphAttrDFlash, formatAttr(v))
		}
		isDFlash = true
		delete(rest, GraphAttrDFlash)
	}
	if isDFlash && isMTP {
		return fmt.Errorf("graph attributes %s and %s: a graph is the MTP layer's or a DFlash drafter's, not both", GraphAttrMTPLayer, GraphAttrDFlash)
	}
	g.mode, g.mtpLayer, g.isMTP, g.isDFlash, g.Attrs = mode, mtp, isMTP, isDFlash, rest
	return nil
}
