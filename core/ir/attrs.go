package ir

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Attrs are a node's (or a graph's) attributes. Values are int, float64,
// string, bool or []int; anything else is rejected by the verifier, and so
// is an attribute the node's op does not declare (OpDef.Attrs) or a value of
// another type than the declared one. Code reads them through the declared
// attributes (Attr.Get), never by string.
type Attrs map[string]any

// Clone returns a shallow copy.
func (a Attrs) Clone() Attrs {
	c := Attrs{}
	for k, v := range a {
		c[k] = v
	}
	return c
}

// Put sets the given attributes in a and returns a.
func (a Attrs) Put(kvs ...KV) Attrs {
	for _, kv := range kvs {
		a[kv.Name] = kv.Value
	}
	return a
}

// NewAttrs returns attributes holding kvs (ir.NewAttrs(ir.AttrEps.Is(1e-5))).
func NewAttrs(kvs ...KV) Attrs { return Attrs{}.Put(kvs...) }

// Format prints attributes sorted by key: "{a=1, b="x"}".
func (a Attrs) Format() string {
	if len(a) == 0 {
		return ""
	}
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + formatAttr(a[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func formatAttr(v any) string {
	switch x := v.(type) {
	case int:
		return strconv.Itoa(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		return strconv.Quote(x)
	case bool:
		return strconv.FormatBool(x)
	case []int:
		s := make([]string, len(x))
		for i, e := range x {
			s[i] = strconv.Itoa(e)
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	return fmt.Sprintf("<%T>", v)
}

func validAttr(v any) bool { return typeOfValue(v) != 0 }

// AttrType is the type of an attribute's values.
type AttrType uint8

// Attribute types: the value types Attrs hold.
const (
	IntAttr    AttrType = iota + 1 // int
	FloatAttr                      // float64
	StringAttr                     // string
	BoolAttr                       // bool
	IntsAttr                       // []int
)

func (t AttrType) String() string {
	switch t {
	case IntAttr:
		return "int"
	case FloatAttr:
		return "float"
	case StringAttr:
		return "string"
	case BoolAttr:
		return "bool"
	case IntsAttr:
		return "int list"
	}
	return fmt.Sprintf("attrtype(%d)", int(t))
}

// typeOfValue is the attribute type of a value (0: none).
func typeOfValue(v any) AttrType {
	switch v.(type) {
	case int:
		return IntAttr
	case float64:
		return FloatAttr
	case string:
		return StringAttr
	case bool:
		return BoolAttr
	case []int:
		return IntsAttr
	}
	return 0
}

// AttrDef declares one attribute of an op (OpDef.Attrs) or of graphs
// (GraphAttrs): its name, value type, the value an absent attribute reads
// as, and what it means. Declarations are made through the typed names
// (AttrEps.Default(1e-5, "…")), which fix Type and Default's type.
type AttrDef struct {
	Name string
	Type AttrType
	// Default is what Attr.Get returns for a node without the attribute
	// (nil: the type's zero value). For a required attribute it is the
	// value shape inference sees, and refuses, when the node lacks it.
	Default any
	// Required: a node must set it; the verifier rejects one that does not.
	Required bool
	Doc      string
}

func (d AttrDef) check() error {
	if d.Name == "" || d.Doc == "" {
		return fmt.Errorf("attribute %q needs a name and a doc", d.Name)
	}
	if d.Type < IntAttr || d.Type > IntsAttr {
		return fmt.Errorf("attribute %q: unknown type %v", d.Name, d.Type)
	}
	if d.Default != nil && typeOfValue(d.Default) != d.Type {
		return fmt.Errorf("attribute %q: default %v is %T, the attribute is %s", d.Name, d.Default, d.Default, d.Type)
	}
	return nil
}

// AttrValue is the Go type of an attribute's values.
type AttrValue interface {
	int | float64 | string | bool | []int
}

// Attr is the name of an attribute whose values have Go type T: what code
// reads (Get, Lookup), writes (Is, Set) and declares (Default, Required,
// Optional) attributes through, so that a name is spelt once and a value's
// type is checked by the compiler.
type Attr[T AttrValue] struct{ Name string }

// String is the attribute's name.
func (a Attr[T]) String() string { return a.Name }

// Type is the attribute type of T.
func (a Attr[T]) Type() AttrType {
	var z T
	return typeOfValue(any(z))
}

// Default declares the attribute with the value an absent one reads as.
func (a Attr[T]) Default(def T, doc string) AttrDef {
	return AttrDef{Name: a.Name, Type: a.Type(), Default: def, Doc: doc}
}

// Optional declares the attribute without a default: absent reads as T's
// zero value, and Lookup tells absent from set.
func (a Attr[T]) Optional(doc string) AttrDef {
	return AttrDef{Name: a.Name, Type: a.Type(), Doc: doc}
}

// Required declares an attribute every node of the op sets.
func (a Attr[T]) Required(doc string) AttrDef {
	return AttrDef{Name: a.Name, Type: a.Type(), Required: true, Doc: doc}
}

// Is is the attribute set to v, for NewAttrs and Attrs.Put.
func (a Attr[T]) Is(v T) KV { return KV{Name: a.Name, Value: v} }

// Set sets the attribute on n.
func (a Attr[T]) Set(n *Node, v T) {
	if n.Attrs == nil {
		n.Attrs = Attrs{}
	}
	n.Attrs[a.Name] = v
}

// Lookup returns n's value of the attribute and whether n sets it (with a
// value of the declared type; an int stands for a float). It panics when
// n's op does not declare the attribute: reading an undeclared attribute
// is a programmer error.
func (a Attr[T]) Lookup(n *Node) (T, bool) {
	a.decl(n)
	if v, ok := n.Attrs[a.Name]; ok {
		return as[T](v)
	}
	var z T
	return z, false
}

// Get returns n's value of the attribute, or the default n's op declares
// for it when n does not set it. It panics when the op does not declare it.
func (a Attr[T]) Get(n *Node) T {
	d := a.decl(n)
	if v, ok := n.Attrs[a.Name]; ok {
		if t, ok := as[T](v); ok {
			return t
		}
	}
	if d.Default != nil {
		return d.Default.(T)
	}
	var z T
	return z
}

func (a Attr[T]) decl(n *Node) AttrDef {
	d, ok := n.Def().Attr(a.Name)
	if !ok {
		panic(fmt.Sprintf("ir: op %q declares no attribute %q", n.Op, a.Name))
	}
	return d
}

// as converts an attribute value to T: the same type, or an int for a float.
func as[T AttrValue](v any) (T, bool) {
	if t, ok := v.(T); ok {
		return t, true
	}
	var z T
	if _, float := any(z).(float64); float {
		if i, ok := v.(int); ok {
			return any(float64(i)).(T), true
		}
	}
	return z, false
}

// KV is an attribute and its value (Attr.Is).
type KV struct {
	Name  string
	Value any
}
