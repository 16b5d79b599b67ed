package ir

import (
	"fmt"
	"slices"
)

// Ops added for pass plugins (the shared-expert fusion example). A plugin's
// op declares its attributes as the built-in ones do (OpDef.Attrs, with a
// name of type Attr[T]): the verifier checks them and Attr.Get reads them.

// OpMoEAppendExpert appends an always-selected expert to a routing.
const OpMoEAppendExpert = "moe_append_expert"

func init() {
	MustRegister(OpDef{Name: OpMoEAppendExpert, Doc: "routing + one always-selected expert: idx [T,K] → [T,K+1] with attr expert appended, w [T,K] → [T,K+1] with weight 1.0 appended",
		MinInputs: 2, MaxInputs: 2, Infer: inferMoEAppendExpert,
		Attrs: []AttrDef{AttrExpert.Required("the appended expert's index (≥ 0)")}})
}

func inferMoEAppendExpert(n *Node) ([]OutType, error) {
	idx, err := need(n, 0, I32, 2)
	if err != nil {
		return nil, err
	}
	w, err := need(n, 1, F32, 2)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(idx.Shape, w.Shape) {
		return nil, fmt.Errorf("idx %v and weights %v differ", idx.Shape, w.Shape)
	}
	if e, ok := AttrExpert.Lookup(n); !ok || e < 0 {
		return nil, fmt.Errorf("attribute expert must be ≥ 0")
	}
	K := idx.Shape[1]
	return []OutType{out("idx", I32, idx.Shape[0], K+1), out("w", F32, w.Shape[0], K+1)}, nil
}
