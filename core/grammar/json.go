package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
)

// MaxSchemaBytes bounds a JSON Schema's text.
const MaxSchemaBytes = 64 << 10

// MaxSchemaDepth bounds how deeply schemas nest (subschemas and $ref
// expansions together).
const MaxSchemaDepth = 32

// ObjectDepth is how deeply the objects and arrays of json_object (and of
// a schema that leaves a value's type open) may nest: a value at this
// depth is a string, number, boolean or null.
const ObjectDepth = 6

// MaxLength bounds minLength, maxLength, minItems and maxItems.
const MaxLength = 1000

// annotations are the keywords that change nothing about valid values.
var annotations = []string{"title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"}

// keywords are the keywords the compiler honours.
var keywords = []string{"type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf", "$ref", "items", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format"}

// formats maps the string formats supported to regexes of a subset of
// their values (days up to 28, so every date exists; times without leap
// seconds; a plain email address).
var formats = map[string]string{
	"date":      `[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])`,
	"time":      `([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])`,
	"date-time": `[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])`,
	"uuid":      `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`,
	"email":     `[a-zA-Z0-9_+-]{1,32}(\.[a-zA-Z0-9_+-]{1,16})?@[a-z]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z]([a-z0-9-]{0,20}[a-z0-9])?){0,2}\.[a-z]{2,6}`,
}

// The pieces of JSON text (compact: no whitespace anywhere).
const (
	// Integer parts of at most 15 digits (exact in a double: JavaScript's
	// Number, Go's float64), fractions of at most 15, exponents of two
	// digits: every number is a finite double, every integer exact.
	numberRe  = `-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?([eE][+-]?[1-9][0-9]?)?`
	integerRe = `-?(0|[1-9][0-9]{0,14})`
)

// jsonChar is one character of a JSON string's text: an unescaped rune, a
// short escape or a \u escape (surrogates excluded).
func (n *nfa) jsonChar(next int32) int32 {
	return n.alt(next,
		func(next int32) int32 { return n.runes(jsonSafe([][2]rune{{0, 0x10FFFF}}), next) },
		func(next int32) int32 {
			return n.regex(`\\(["\\/bfnrt]|u([0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))`, nil, next)
		},
	)
}

// jsonString is a JSON string of min..max characters (max < 0: any).
func (n *nfa) jsonString(min, max int, next int32) int32 {
	return n.lit(`"`, n.repeat(n.jsonChar, min, max, n.lit(`"`, next)))
}

// jsonValue is any JSON value, objects and arrays nesting up to depth.
func (n *nfa) jsonValue(depth int, next int32) int32 {
	ps := []func(int32) int32{
		func(next int32) int32 { return n.jsonString(0, -1, next) },
		func(next int32) int32 { return n.regex(numberRe, nil, next) },
		func(next int32) int32 { return n.lit("true", next) },
		func(next int32) int32 { return n.lit("false", next) },
		func(next int32) int32 { return n.lit("null", next) },
	}
	if depth > 0 {
		ps = append(ps,
			func(next int32) int32 { return n.jsonObject(depth, next) },
			func(next int32) int32 { return n.jsonArray(depth, next) })
	}
	return n.alt(next, ps...)
}

// jsonObject is any JSON object whose values nest up to depth−1.
func (n *nfa) jsonObject(depth int, next int32) int32 {
	member := func(next int32) int32 {
		return n.jsonString(0, -1, n.lit(":", n.jsonValue(depth-1, next)))
	}
	return n.lit("{", n.sep(member, ",", 0, -1, n.lit("}", next)))
}

// jsonArray is any JSON array whose items nest up to depth−1.
func (n *nfa) jsonArray(depth int, next int32) int32 {
	item := func(next int32) int32 { return n.jsonValue(depth-1, next) }
	return n.lit("[", n.sep(item, ",", 0, -1, n.lit("]", next)))
}

// schemaCompiler compiles a JSON Schema (the subset documented on
// CompileSchema) onto the NFA.
type schemaCompiler struct {
	n     *nfa
	root  map[string]json.RawMessage
	refs  []string // the $ref expansions in progress (recursion)
	depth int
}

func (c *schemaCompiler) fail(path, format string, args ...any) int32 {
	c.n.fail(fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	return acceptState
}

// object decodes raw as a schema object (true is any value; false none).
func decodeSchema(raw json.RawMessage) (map[string]json.RawMessage, error) {
	t := bytes.TrimSpace(raw)
	switch string(t) {
	case "true":
		return map[string]json.RawMessage{}, nil
	case "false":
		return nil, fmt.Errorf("the schema false accepts no value")
	}
	if len(t) == 0 || t[0] != '{' {
		return nil, fmt.Errorf("a schema must be an object or a boolean")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(t, &m); err != nil {
		return nil, err
	}
	return m, nil
}

func (c *schemaCompiler) schema(raw json.RawMessage, path string, next int32) int32 {
	if c.n.err != nil {
		return next
	}
	c.depth++
	defer func() { c.depth-- }()
	if c.depth > MaxSchemaDepth {
		return c.fail(path, "schemas nest more than %d deep", MaxSchemaDepth)
	}
	s, err := decodeSchema(raw)
	if err != nil {
		return c.fail(path, "%v", err)
	}
	var ks []string
	for k := range s {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	for _, k := range ks {
		if !slices.Contains(keywords, k) && !slices.Contains(annotations, k) {
			return c.fail(path+"."+k, "the keyword %q is not supported by structured output (supported: %s)", k, strings.Join(keywords, ", "))
		}
	}
	if ref, ok := s["$ref"]; ok {
		return c.ref(s, ref, path, next)
	}
	for _, kw := range []string{"const", "enum"} {
		v, ok := s[kw]
		if !ok {
			continue
		}
		if o := only(s, kw, "type"); o != "" {
			return c.fail(path+"."+o, "beside %s: not supported", kw)
		}
		vals := []json.RawMessage{v}
		if kw == "enum" {
			if err := json.Unmarshal(v, &vals); err != nil || len(vals) == 0 {
				return c.fail(path+".enum", "must be a non-empty array")
			}
		}
		types, err := typesOf(s)
		if err != nil {
			return c.fail(path+".type", "%v", err)
		}
		var ps []func(int32) int32
		for i, val := range vals {
			if !fits(val, types) {
				continue // a value of another type is not valid
			}
			field := path + ".const"
			if kw == "enum" {
				field = fmt.Sprintf("%s.enum[%d]", path, i)
			}
			ps = append(ps, func(next int32) int32 { return c.literal(val, field, next) })
		}
		if len(ps) == 0 {
			return c.fail(path+"."+kw, "no value of type %s", strings.Join(types, "/"))
		}
		return c.n.alt(next, ps...)
	}
	for _, kw := range []string{"anyOf", "oneOf"} {
		v, ok := s[kw]
		if !ok {
			continue
		}
		if o := only(s, kw); o != "" {
			return c.fail(path+"."+o, "beside %s: not supported (put it in each branch)", kw)
		}
		var subs []json.RawMessage
		if err := json.Unmarshal(v, &subs); err != nil || len(subs) == 0 {
			return c.fail(path+"."+kw, "must be a non-empty array of schemas")
		}
		if kw == "oneOf" {
			if err := c.disjoint(subs, path); err != nil {
				return c.fail(path+".oneOf", "%v", err)
			}
		}
		ps := make([]func(int32) int32, len(subs))
		for i, sub := range subs {
			ps[i] = func(next int32) int32 { return c.schema(sub, fmt.Sprintf("%s.%s[%d]", path, kw, i), next) }
		}
		return c.n.alt(next, ps...)
	}
	types, err := typesOf(s)
	if err != nil {
		return c.fail(path+".type", "%v", err)
	}
	if len(types) == 0 {
		if o := only(s); o != "" {
			return c.fail(path+"."+o, "needs a type")
		}
		return c.n.jsonValue(ObjectDepth, next)
	}
	ps := make([]func(int32) int32, len(types))
	for i, t := range types {
		ps[i] = func(next int32) int32 { return c.typed(t, s, path, next) }
	}
	if len(ps) == 1 {
		return ps[0](next)
	}
	return c.n.alt(next, ps...)
}

// only returns a keyword of s (sorted first) that is neither an annotation
// nor one of allowed, or "".
func only(s map[string]json.RawMessage, allowed ...string) string {
	var bad []string
	for k := range s {
		if !slices.Contains(annotations, k) && !slices.Contains(allowed, k) {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return ""
	}
	slices.Sort(bad)
	return bad[0]
}

func typesOf(s map[string]json.RawMessage) ([]string, error) {
	raw, ok := s["type"]
	if !ok {
		return nil, nil
	}
	var one string
	var many []string
	if json.Unmarshal(raw, &one) == nil {
		many = []string{one}
	} else if err := json.Unmarshal(raw, &many); err != nil || len(many) == 0 {
		return nil, fmt.Errorf("must be a type name or a non-empty array of them")
	}
	for _, t := range many {
		switch t {
		case "string", "number", "integer", "boolean", "null", "object", "array":
		default:
			return nil, fmt.Errorf("unknown type %q", t)
		}
	}
	return many, nil
}

// allowedFor are the keywords each type takes.
var allowedFor = map[string][]string{
	"string":  {"type", "minLength", "maxLength", "pattern", "format"},
	"number":  {"type"},
	"integer": {"type"},
	"boolean": {"type"},
	"null":    {"type"},
	"object":  {"type", "properties", "required", "additionalProperties"},
	"array":   {"type", "items", "minItems", "maxItems"},
}

func (c *schemaCompiler) typed(t string, s map[string]json.RawMessage, path string, next int32) int32 {
	var all []string
	types, _ := typesOf(s)
	for _, tt := range types {
		all = append(all, allowedFor[tt]...)
	}
	if o := only(s, all...); o != "" {
		return c.fail(path+"."+o, "does not apply to type %s", strings.Join(types, "/"))
	}
	switch t {
	case "string":
		return c.str(s, path, next)
	case "number":
		return c.n.regex(numberRe, nil, next)
	case "integer":
		return c.n.regex(integerRe, nil, next)
	case "boolean":
		return c.n.alt(next, func(next int32) int32 { return c.n.lit("true", next) }, func(next int32) int32 { return c.n.lit("false", next) })
	case "null":
		return c.n.lit("null", next)
	case "object":
		return c.object(s, path, next)
	}
	return c.array(s, path, next)
}

// count reads a non-negative bounded integer keyword (def when absent).
func (c *schemaCompiler) count(s map[string]json.RawMessage, kw, path string, def int) (int, bool) {
	raw, ok := s[kw]
	if !ok {
		return def, true
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil || v != float64(int(v)) || v < 0 {
		c.fail(path+"."+kw, "must be a non-negative integer")
		return 0, false
	}
	if v > MaxLength {
		c.fail(path+"."+kw, "at most %d, got %v", MaxLength, v)
		return 0, false
	}
	return int(v), true
}

func (c *schemaCompiler) str(s map[string]json.RawMessage, path string, next int32) int32 {
	minL, ok1 := c.count(s, "minLength", path, 0)
	maxL, ok2 := c.count(s, "maxLength", path, -1)
	if !ok1 || !ok2 {
		return next
	}
	if maxL >= 0 && minL > maxL {
		return c.fail(path+".minLength", "%d exceeds maxLength %d", minL, maxL)
	}
	_, hasP := s["pattern"]
	_, hasF := s["format"]
	lengths := s["minLength"] != nil || s["maxLength"] != nil
	switch {
	case hasP && hasF:
		return c.fail(path+".format", "beside pattern: not supported")
	case (hasP || hasF) && lengths:
		return c.fail(path+".minLength", "beside pattern or format: not supported")
	case hasP:
		var p string
		if err := json.Unmarshal(s["pattern"], &p); err != nil {
			return c.fail(path+".pattern", "must be a string")
		}
		// The pattern's text is written unescaped: runes a JSON string
		// escapes ('"', '\\', control characters) are left out. Checked
		// alone first, so an error names the keyword.
		probe := newNFA()
		if st := probe.regex(p, jsonSafe, acceptState); probe.err != nil {
			return c.fail(path+".pattern", "%v", probe.err)
		} else if probe.distances()[st] == unreachable {
			return c.fail(path+".pattern", "%q matches no text a JSON string holds unescaped ('\"', '\\\\' and control characters are left out)", p)
		}
		return c.n.lit(`"`, c.n.regex(p, jsonSafe, c.n.lit(`"`, next)))
	case hasF:
		var f string
		if err := json.Unmarshal(s["format"], &f); err != nil {
			return c.fail(path+".format", "must be a string")
		}
		re, ok := formats[f]
		if !ok {
			names := make([]string, 0, len(formats))
			for k := range formats {
				names = append(names, k)
			}
			slices.Sort(names)
			return c.fail(path+".format", "%q is not supported (supported: %s)", f, strings.Join(names, ", "))
		}
		return c.n.lit(`"`, c.n.regex(re, nil, c.n.lit(`"`, next)))
	}
	return c.n.jsonString(minL, maxL, next)
}

// literal is the JSON value raw, compacted.
func (c *schemaCompiler) literal(raw json.RawMessage, path string, next int32) int32 {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return c.fail(path, "invalid JSON: %v", err)
	}
	return c.n.lit(b.String(), next)
}

func (c *schemaCompiler) ref(s map[string]json.RawMessage, raw json.RawMessage, path string, next int32) int32 {
	if o := only(s, "$ref"); o != "" {
		return c.fail(path+"."+o, "beside $ref: not supported")
	}
	var ref string
	if err := json.Unmarshal(raw, &ref); err != nil {
		return c.fail(path+".$ref", "must be a string")
	}
	var name, section string
	switch {
	case strings.HasPrefix(ref, "#/$defs/"):
		section, name = "$defs", ref[len("#/$defs/"):]
	case strings.HasPrefix(ref, "#/definitions/"):
		section, name = "definitions", ref[len("#/definitions/"):]
	default:
		return c.fail(path+".$ref", "%q: only references to #/$defs/NAME or #/definitions/NAME are supported", ref)
	}
	if slices.Contains(c.refs, ref) {
		return c.fail(path+".$ref", "%q is recursive (%s → %s): recursive schemas are not supported", ref, strings.Join(c.refs, " → "), ref)
	}
	var defs map[string]json.RawMessage
	if d, ok := c.root[section]; !ok || json.Unmarshal(d, &defs) != nil {
		return c.fail(path+".$ref", "%q: the schema has no %s object", ref, section)
	}
	def, ok := defs[name]
	if !ok {
		return c.fail(path+".$ref", "%q: no such definition", ref)
	}
	c.refs = append(c.refs, ref)
	defer func() { c.refs = c.refs[:len(c.refs)-1] }()
	return c.schema(def, ref, next)
}

// orderedKeys returns the keys of a JSON object in their order.
func orderedKeys(raw json.RawMessage) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("must be an object")
	}
	var keys []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, t.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

func quote(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}

func (c *schemaCompiler) object(s map[string]json.RawMessage, path string, next int32) int32 {
	closed := false
	if ap, ok := s["additionalProperties"]; ok {
		t := string(bytes.TrimSpace(ap))
		if t != "false" && t != "true" {
			return c.fail(path+".additionalProperties", "only false or true is supported (the output holds the declared properties only)")
		}
		closed = t == "false"
	}
	var required []string
	if r, ok := s["required"]; ok {
		if err := json.Unmarshal(r, &required); err != nil {
			return c.fail(path+".required", "must be an array of property names")
		}
	}
	pr, ok := s["properties"]
	if !ok {
		if len(required) > 0 {
			return c.fail(path+".required", "names %q, which properties does not declare", required[0])
		}
		if closed {
			return c.n.lit("{}", next) // no property allowed
		}
		return c.n.jsonObject(ObjectDepth, next)
	}
	keys, err := orderedKeys(pr)
	if err != nil {
		return c.fail(path+".properties", "%v", err)
	}
	var props map[string]json.RawMessage
	if err := json.Unmarshal(pr, &props); err != nil {
		return c.fail(path+".properties", "%v", err)
	}
	for _, r := range required {
		if _, ok := props[r]; !ok {
			return c.fail(path+".required", "names %q, which properties does not declare", r)
		}
	}
	// Properties in schema order, each optional one optional: entry[i][e]
	// starts at property i, e telling whether one was written (a comma
	// then comes first).
	end := c.n.lit("}", next)
	after := [2]int32{end, end}
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		member := c.n.lit(quote(k)+":", c.schema(props[k], path+".properties."+k, after[1]))
		cur := [2]int32{member, c.n.lit(",", member)}
		if !slices.Contains(required, k) {
			cur = [2]int32{c.n.eps(cur[0], after[0]), c.n.eps(cur[1], after[1])}
		}
		after = cur
	}
	return c.n.lit("{", after[0])
}

func (c *schemaCompiler) array(s map[string]json.RawMessage, path string, next int32) int32 {
	minI, ok1 := c.count(s, "minItems", path, 0)
	maxI, ok2 := c.count(s, "maxItems", path, -1)
	if !ok1 || !ok2 {
		return next
	}
	if maxI >= 0 && minI > maxI {
		return c.fail(path+".minItems", "%d exceeds maxItems %d", minI, maxI)
	}
	items, ok := s["items"]
	item := func(next int32) int32 {
		if !ok {
			return c.n.jsonValue(ObjectDepth-1, next)
		}
		return c.schema(items, path+".items", next)
	}
	return c.n.lit("[", c.n.sep(item, ",", minI, maxI, c.n.lit("]", next)))
}

// MaxOneOfBranches bounds a oneOf's branches.
const MaxOneOfBranches = 16

// disjoint checks that no value is valid under two branches of a oneOf (a
// value valid under both fails oneOf), soundly and simply: two branches
// are exclusive when the JSON types they admit differ (integer counting as
// number), or when both are literals (const, enum) with no value in
// common. Anything else is refused: anyOf says the same without the
// exclusion.
func (c *schemaCompiler) disjoint(subs []json.RawMessage, path string) error {
	if len(subs) > MaxOneOfBranches {
		return fmt.Errorf("at most %d branches, got %d", MaxOneOfBranches, len(subs))
	}
	kinds := make([]branchKind, len(subs))
	for i, sub := range subs {
		kinds[i] = c.kindOf(sub, 0)
	}
	for i := range kinds {
		for j := i + 1; j < len(kinds); j++ {
			a, b := kinds[i], kinds[j]
			common := a.types & b.types
			if common == 0 {
				continue
			}
			if a.literal && b.literal && !a.shares(b) {
				continue
			}
			return fmt.Errorf("branches %d and %d may both accept a value of type %s (a value valid under two branches fails oneOf): use anyOf, or make their types or literal values differ", i, j, typeNames(common))
		}
	}
	return nil
}

// JSON types as bits (integer is a number).
const (
	tString = 1 << iota
	tNumber
	tBoolean
	tNull
	tObject
	tArray
	tAny = tString | tNumber | tBoolean | tNull | tObject | tArray
)

func typeNames(t int) string {
	var ns []string
	for i, n := range []string{"string", "number", "boolean", "null", "object", "array"} {
		if t&(1<<i) != 0 {
			ns = append(ns, n)
		}
	}
	return strings.Join(ns, "/")
}

// branchKind is what a oneOf's check knows of a branch: the JSON types it
// may admit and, for a literal, its values.
type branchKind struct {
	types   int
	literal bool
	values  []any
}

func (a branchKind) shares(b branchKind) bool {
	for _, x := range a.values {
		for _, y := range b.values {
			if reflect.DeepEqual(x, y) {
				return true
			}
		}
	}
	return false
}

func typeOfValue(v any) int {
	switch v.(type) {
	case string:
		return tString
	case float64:
		return tNumber
	case bool:
		return tBoolean
	case nil:
		return tNull
	case map[string]any:
		return tObject
	}
	return tArray
}

// kindOf is a schema's branchKind (tAny where it cannot tell).
func (c *schemaCompiler) kindOf(raw json.RawMessage, depth int) branchKind {
	anyKind := branchKind{types: tAny}
	s, err := decodeSchema(raw)
	if err != nil || depth > MaxSchemaDepth {
		return anyKind
	}
	if ref, ok := s["$ref"]; ok {
		var r string
		if json.Unmarshal(ref, &r) != nil {
			return anyKind
		}
		for _, sec := range []string{"$defs", "definitions"} {
			if name, ok := strings.CutPrefix(r, "#/"+sec+"/"); ok {
				var defs map[string]json.RawMessage
				if json.Unmarshal(c.root[sec], &defs) == nil {
					if d, ok := defs[name]; ok {
						return c.kindOf(d, depth+1)
					}
				}
			}
		}
		return anyKind
	}
	lit := func(vals []any) branchKind {
		k := branchKind{literal: true, values: vals}
		for _, v := range vals {
			k.types |= typeOfValue(v)
		}
		return k
	}
	if v, ok := s["const"]; ok {
		var x any
		if json.Unmarshal(v, &x) != nil {
			return anyKind
		}
		return lit([]any{x})
	}
	if v, ok := s["enum"]; ok {
		var xs []any
		if json.Unmarshal(v, &xs) != nil {
			return anyKind
		}
		return lit(xs)
	}
	for _, kw := range []string{"anyOf", "oneOf"} {
		if v, ok := s[kw]; ok {
			var subs []json.RawMessage
			if json.Unmarshal(v, &subs) != nil {
				return anyKind
			}
			k := branchKind{literal: true}
			for _, sub := range subs {
				sk := c.kindOf(sub, depth+1)
				k.types |= sk.types
				k.literal = k.literal && sk.literal
				k.values = append(k.values, sk.values...)
			}
			return k
		}
	}
	types, err := typesOf(s)
	if err != nil || len(types) == 0 {
		return anyKind
	}
	k := branchKind{}
	for _, t := range types {
		switch t {
		case "string":
			k.types |= tString
		case "number", "integer":
			k.types |= tNumber
		case "boolean":
			k.types |= tBoolean
		case "null":
			k.types |= tNull
		case "object":
			k.types |= tObject
		case "array":
			k.types |= tArray
		}
	}
	return k
}

// fits reports whether a literal JSON value has one of types (all when
// none are given; an integer is a number without a fraction).
func fits(raw json.RawMessage, types []string) bool {
	if len(types) == 0 {
		return true
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return true // the literal's own error is reported when compiled
	}
	for _, t := range types {
		switch x := v.(type) {
		case string:
			if t == "string" {
				return true
			}
		case float64:
			if t == "number" || (t == "integer" && x == math.Trunc(x)) {
				return true
			}
		case bool:
			if t == "boolean" {
				return true
			}
		case nil:
			if t == "null" {
				return true
			}
		case map[string]any:
			if t == "object" {
				return true
			}
		case []any:
			if t == "array" {
				return true
			}
		}
	}
	return false
}
