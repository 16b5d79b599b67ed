package chat

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// toJSON is the tojson filter as transformers defines it for chat templates
// (Python's json.dumps: ", " and ": " separators, no HTML escaping,
// ensure_ascii false by default, indent), where gonja's own writes compact
// Go JSON with <, > and & escaped, so that a template's tools render as
// they did in training ({"name": "get_weather", …}). Mappings the template
// made keep their order; the request's objects (Go maps) render with
// sorted keys.
func toJSON(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	ascii, indent := false, -1
	for k, v := range params.KwArgs {
		switch k {
		case "ensure_ascii":
			ascii = v.IsTrue()
		case "indent":
			if !v.IsNil() {
				if !v.IsInteger() || v.Integer() < 0 || v.Integer() > 16 {
					return exec.AsValue(fmt.Errorf("tojson: indent must be an integer in [0, 16], got %s", v.String()))
				}
				indent = v.Integer()
			}
		case "sort_keys", "separators":
		default:
			return exec.AsValue(fmt.Errorf("tojson: unknown argument %q", k))
		}
	}
	if len(params.Args) > 0 {
		return exec.AsValue(fmt.Errorf("tojson takes keyword arguments only"))
	}
	w := &pyJSON{ascii: ascii, indent: indent}
	if err := w.value(in.Interface(), 0); err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(w.sb.String())
}

type pyJSON struct {
	sb     strings.Builder
	ascii  bool
	indent int // -1: one line
}

// maxJSONDepth bounds the nesting tojson follows (above the request's own
// bounds: a tool's parameters nest 64 deep inside its two wrappers).
const maxJSONDepth = 128

func (w *pyJSON) newline(depth int) {
	if w.indent >= 0 {
		w.sb.WriteByte('\n')
		w.sb.WriteString(strings.Repeat(" ", w.indent*depth))
	}
}

func (w *pyJSON) sep() {
	if w.indent >= 0 {
		w.sb.WriteByte(',')
	} else {
		w.sb.WriteString(", ")
	}
}

func (w *pyJSON) object(keys []string, val func(int) any, depth int) error {
	if len(keys) == 0 {
		w.sb.WriteString("{}")
		return nil
	}
	w.sb.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			w.sep()
		}
		w.newline(depth + 1)
		w.str(k)
		w.sb.WriteString(": ")
		if err := w.value(val(i), depth+1); err != nil {
			return err
		}
	}
	w.newline(depth)
	w.sb.WriteByte('}')
	return nil
}

func (w *pyJSON) value(v any, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("tojson: nested deeper than %d", maxJSONDepth)
	}
	if w.sb.Len() > DefaultLimits.MaxOutput {
		return fmt.Errorf("%w (tojson: more than %d bytes)", ErrLimit, DefaultLimits.MaxOutput)
	}
	switch x := v.(type) {
	case nil:
		w.sb.WriteString("null")
		return nil
	case *exec.Value:
		return w.value(x.Interface(), depth)
	case *exec.Dict:
		return w.dict(x, depth)
	case exec.Dict:
		return w.dict(&x, depth)
	case bool:
		w.sb.WriteString(strconv.FormatBool(x))
		return nil
	case string:
		w.str(x)
		return nil
	case json.Number:
		w.sb.WriteString(x.String())
		return nil
	case float64:
		return w.float(x)
	case float32:
		return w.float(float64(x))
	case map[string]any:
		keys := slices.Sorted(maps.Keys(x))
		return w.object(keys, func(i int) any { return x[keys[i]] }, depth)
	case []any:
		return w.list(len(x), func(i int) any { return x[i] }, depth)
	}
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		w.sb.WriteString(strconv.FormatInt(r.Int(), 10))
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		w.sb.WriteString(strconv.FormatUint(r.Uint(), 10))
		return nil
	case reflect.Slice, reflect.Array:
		return w.list(r.Len(), func(i int) any { return r.Index(i).Interface() }, depth)
	case reflect.Map:
		if r.Type().Key().Kind() != reflect.String {
			break
		}
		var keys []string
		for _, k := range r.MapKeys() {
			keys = append(keys, k.String())
		}
		slices.Sort(keys)
		return w.object(keys, func(i int) any { return r.MapIndex(reflect.ValueOf(keys[i]).Convert(r.Type().Key())).Interface() }, depth)
	}
	return fmt.Errorf("tojson: cannot write a %T as JSON", v)
}

func (w *pyJSON) dict(d *exec.Dict, depth int) error {
	keys := make([]string, len(d.Pairs))
	for i, p := range d.Pairs {
		keys[i] = p.Key.String()
	}
	return w.object(keys, func(i int) any { return d.Pairs[i].Value }, depth)
}

func (w *pyJSON) list(n int, at func(int) any, depth int) error {
	if n == 0 {
		w.sb.WriteString("[]")
		return nil
	}
	w.sb.WriteByte('[')
	for i := range n {
		if i > 0 {
			w.sep()
		}
		w.newline(depth + 1)
		if err := w.value(at(i), depth+1); err != nil {
			return err
		}
	}
	w.newline(depth)
	w.sb.WriteByte(']')
	return nil
}

// float writes a number as JSON: integral values without a fraction (as
// JSON decoding made them floats), others in their shortest form.
func (w *pyJSON) float(f float64) error {
	switch {
	case math.IsNaN(f):
		w.sb.WriteString("NaN")
	case math.IsInf(f, 1):
		w.sb.WriteString("Infinity")
	case math.IsInf(f, -1):
		w.sb.WriteString("-Infinity")
	case f == math.Trunc(f) && math.Abs(f) < 1e16:
		w.sb.WriteString(strconv.FormatInt(int64(f), 10))
	default:
		w.sb.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
	}
	return nil
}

// str writes a JSON string as Python's json.dumps does.
func (w *pyJSON) str(s string) {
	const hex = "0123456789abcdef"
	w.sb.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			w.sb.WriteString(`\"`)
		case r == '\\':
			w.sb.WriteString(`\\`)
		case r == '\n':
			w.sb.WriteString(`\n`)
		case r == '\r':
			w.sb.WriteString(`\r`)
		case r == '\t':
			w.sb.WriteString(`\t`)
		case r == '\b':
			w.sb.WriteString(`\b`)
		case r == '\f':
			w.sb.WriteString(`\f`)
		case r < 0x20 || (w.ascii && r > 0x7f):
			if r == utf8.RuneError {
				r = 0xfffd
			}
			if r > 0xffff {
				r -= 0x10000
				hi, lo := 0xd800+(r>>10), 0xdc00+(r&0x3ff)
				w.sb.WriteString(`\u` + string([]byte{hex[hi>>12&15], hex[hi>>8&15], hex[hi>>4&15], hex[hi&15]}))
				w.sb.WriteString(`\u` + string([]byte{hex[lo>>12&15], hex[lo>>8&15], hex[lo>>4&15], hex[lo&15]}))
				continue
			}
			w.sb.WriteString(`\u` + string([]byte{hex[r>>12&15], hex[r>>8&15], hex[r>>4&15], hex[r&15]}))
		default:
			w.sb.WriteRune(r)
		}
	}
	w.sb.WriteByte('"')
}
