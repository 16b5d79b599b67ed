// Package strict decodes configuration maps (what koanf loads from YAML and
// the environment) into structs without reinterpreting values: an unknown
// key is an error, a float never becomes an integer (2.7 is not 2), a bool
// never becomes a number (true is not 1), an integer must fit its field,
// a duration needs a unit ("30s"; a bare 30 is not 30 ns), and a string is
// not a number ("8" quoted in YAML is refused). Environment variables,
// which can only be text, arrive as Env and are parsed strictly into
// numbers, bools, durations and lists.
package strict

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
)

var durationType = reflect.TypeOf(time.Duration(0))

// DecoderConfig is a strict mapstructure configuration decoding into result
// with the koanf tag.
func DecoderConfig(result any) *mapstructure.DecoderConfig {
	return &mapstructure.DecoderConfig{
		ErrorUnused:      true,
		WeaklyTypedInput: false,
		Result:           result,
		TagName:          "koanf",
		DecodeHook:       Hook,
	}
}

// Env is a value that can only be text (an environment variable's, a
// command-line flag's): Hook
// parses it into the number, bool, duration or comma-separated list its
// field wants. A plain string (a quoted YAML scalar such as "8") is text
// the author chose, and is never taken for a number or a bool.
type Env string

// Hook converts values for the field types a configuration uses, refusing
// every lossy or surprising conversion.
func Hook(f reflect.Type, t reflect.Type, data any) (any, error) {
	if data == nil {
		return data, nil
	}
	if e, ok := data.(Env); ok {
		switch {
		case t == durationType:
		case t.Kind() == reflect.Pointer:
			return e, nil // decoded again into the element
		case t.Kind() == reflect.Slice:
			if strings.TrimSpace(string(e)) == "" {
				return []any{}, nil
			}
			parts := strings.Split(string(e), ",")
			out := make([]any, len(parts))
			for i, p := range parts {
				out[i] = Env(strings.TrimSpace(p))
			}
			return out, nil
		case t.Kind() == reflect.String, t.Kind() == reflect.Interface:
			return string(e), nil
		}
		return parse(t, string(e))
	}
	if f.Kind() == reflect.String && t != durationType {
		switch t.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
			return nil, fmt.Errorf("%q is a string, not a number (in YAML write it without quotes)", data)
		case reflect.Bool:
			return nil, fmt.Errorf("%q is a string, not true or false (in YAML write it without quotes)", data)
		}
	}
	return parse(t, data)
}

// parse is Hook for a value that is not Env: strings (Env's text) are
// parsed strictly.
func parse(t reflect.Type, data any) (any, error) {
	v := reflect.ValueOf(data)
	f := v.Type()
	if t == durationType {
		switch f.Kind() {
		case reflect.String:
			d, err := time.ParseDuration(strings.TrimSpace(v.String()))
			if err != nil {
				return nil, fmt.Errorf("%q is not a duration (write it with a unit, e.g. \"30s\" or \"500ms\")", v.String())
			}
			return d, nil
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
			return nil, fmt.Errorf("%v has no unit: write a duration with one, e.g. \"%vs\" or \"%vms\"", data, data, data)
		}
		return data, nil
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		var i int64
		switch f.Kind() {
		case reflect.String:
			n, err := strconv.ParseInt(strings.TrimSpace(v.String()), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%q is not an integer", v.String())
			}
			i = n
		case reflect.Float32, reflect.Float64:
			return nil, fmt.Errorf("%v is not an integer", data)
		case reflect.Bool:
			return nil, fmt.Errorf("%v is not an integer", data)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			i = v.Int()
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			if v.Uint() > math.MaxInt64 {
				return nil, fmt.Errorf("%v is out of range", data)
			}
			i = int64(v.Uint())
		default:
			return data, nil
		}
		if reflect.Zero(t).OverflowInt(i) {
			return nil, fmt.Errorf("%d is out of range for a %d-bit integer", i, t.Bits())
		}
		return reflect.ValueOf(i).Convert(t).Interface(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		var u uint64
		switch f.Kind() {
		case reflect.String:
			n, err := strconv.ParseUint(strings.TrimSpace(v.String()), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%q is not a non-negative integer", v.String())
			}
			u = n
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			if v.Int() < 0 {
				return nil, fmt.Errorf("%d is negative", v.Int())
			}
			u = uint64(v.Int())
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			u = v.Uint()
		case reflect.Float32, reflect.Float64, reflect.Bool:
			return nil, fmt.Errorf("%v is not an integer", data)
		default:
			return data, nil
		}
		if reflect.Zero(t).OverflowUint(u) {
			return nil, fmt.Errorf("%d is out of range for a %d-bit integer", u, t.Bits())
		}
		return reflect.ValueOf(u).Convert(t).Interface(), nil
	case reflect.Float32, reflect.Float64:
		switch f.Kind() {
		case reflect.String:
			x, err := strconv.ParseFloat(strings.TrimSpace(v.String()), 64)
			if err != nil {
				return nil, fmt.Errorf("%q is not a number", v.String())
			}
			return reflect.ValueOf(x).Convert(t).Interface(), nil
		case reflect.Bool:
			return nil, fmt.Errorf("%v is not a number", data)
		}
	case reflect.Bool:
		if f.Kind() == reflect.String {
			switch strings.TrimSpace(v.String()) {
			case "true":
				return true, nil
			case "false":
				return false, nil
			}
			return nil, fmt.Errorf("%q is not true or false", v.String())
		}
	}
	return data, nil
}

// Message turns mapstructure's wording into one that names keys.
func Message(err error) string {
	s := err.Error()
	s = strings.ReplaceAll(s, "'' has invalid keys:", "unknown key(s):")
	s = strings.ReplaceAll(s, "has invalid keys:", "has unknown key(s):")
	return s
}
