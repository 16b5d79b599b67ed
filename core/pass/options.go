package pass

import (
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/go-viper/mapstructure/v2"

	"github.com/glmflash/glmflash/internal/strict"
)

// A pass declares its options once, as a struct whose fields carry tags:
//
//	type Options struct {
//		Form     string    `option:"form" default:"auto" enum:"auto,full,bfg" doc:"which form to fuse"`
//		MaxTok   int       `option:"max_tokens" default:"0" doc:"decline above this many tokens; 0 = no cap"`
//		Buckets  []int     `option:"buckets" default:"1,8,64" doc:"token-count buckets"`
//		TableDir pass.Path `option:"table_dir" default:"configs/tuning" doc:"where tables live"`
//	}
//
// and returns a pointer to it from Options (WithOptions). The schema that
// `glmflash passes list` prints and the plugin protocol carries is derived
// from the tags (Schema); Configure decodes a configuration's options into
// the struct strictly: an unknown option, a value of the wrong type (2.7 for
// an int, "yes" for a bool) or a value outside enum is an error naming the
// pass and the option, and nothing is reinterpreted. Field types: bool, int,
// float64, string, []int and Path.

// OptionType is the type of a pass option.
type OptionType string

// Option types.
const (
	Bool   OptionType = "bool"
	Int    OptionType = "int"
	Float  OptionType = "float"
	String OptionType = "string"
	Ints   OptionType = "[]int"
	// PathType is a file or directory name: a relative one given in a
	// configuration file is relative to that file.
	PathType OptionType = "path"
)

// Path is an option naming a file or directory (OptionType PathType).
type Path string

// Option declares one option of a pass.
type Option struct {
	Name    string
	Type    OptionType
	Default any
	Doc     string
	// Enum, for string options, lists the allowed values.
	Enum []string
}

// WithOptions is a pass whose options are a struct (see above).
type WithOptions interface {
	Pass
	// Options returns a pointer to the pass's options struct. Configure
	// sets every field: to its default, then to the configured value.
	Options() any
}

// Configurable is a pass whose options are known only at run time (a
// plugin's pass as the engine sees it): its Description.Options declares them,
// and Configure receives them checked and defaulted. Write passes with an
// options struct (WithOptions) instead.
type Configurable interface {
	Pass
	Configure(opts map[string]any) error
}

// Validator is implemented by options structs that check their values
// beyond their types (called after decoding).
type Validator interface {
	Validate() error
}

var pathType = reflect.TypeOf(Path(""))

// goType is the Go type options of type t decode into.
func goType(t OptionType) (reflect.Type, bool) {
	switch t {
	case Bool:
		return reflect.TypeOf(false), true
	case Int:
		return reflect.TypeOf(0), true
	case Float:
		return reflect.TypeOf(0.0), true
	case String:
		return reflect.TypeOf(""), true
	case Ints:
		return reflect.TypeOf([]int(nil)), true
	case PathType:
		return pathType, true
	}
	return nil, false
}

func optionTypeOf(t reflect.Type) (OptionType, bool) {
	for _, ot := range []OptionType{Bool, Int, Float, String, Ints, PathType} {
		if gt, _ := goType(ot); gt == t {
			return ot, true
		}
	}
	return "", false
}

// optionFields lists the tagged fields of an options struct with their
// declarations (defaults parsed).
func optionFields(t reflect.Type) ([]Option, []int, error) {
	if t.Kind() != reflect.Struct {
		return nil, nil, fmt.Errorf("options must be a struct, got %s", t)
	}
	var opts []Option
	var idx []int
	seen := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, ok := f.Tag.Lookup("option")
		if !ok {
			continue
		}
		if name == "" || seen[name] {
			return nil, nil, fmt.Errorf("field %s: option name %q is empty or used twice", f.Name, name)
		}
		seen[name] = true
		ot, ok := optionTypeOf(f.Type)
		if !ok {
			return nil, nil, fmt.Errorf("option %s: field type %s is not bool, int, float64, string, []int or pass.Path", name, f.Type)
		}
		o := Option{Name: name, Type: ot, Doc: f.Tag.Get("doc")}
		if e := f.Tag.Get("enum"); e != "" {
			if ot != String {
				return nil, nil, fmt.Errorf("option %s: enum applies to string options only", name)
			}
			o.Enum = strings.Split(e, ",")
		}
		def, err := parseDefault(ot, f.Tag.Get("default"))
		if err != nil {
			return nil, nil, fmt.Errorf("option %s: default: %w", name, err)
		}
		if len(o.Enum) > 0 && !slices.Contains(o.Enum, def.(string)) {
			return nil, nil, fmt.Errorf("option %s: default %q is not one of %s", name, def, strings.Join(o.Enum, ", "))
		}
		o.Default = def
		opts = append(opts, o)
		idx = append(idx, i)
	}
	return opts, idx, nil
}

// parseDefault reads a default tag: "true", "3", "1e-4", "text", "1,8,64".
// An absent default is the type's zero value.
func parseDefault(t OptionType, s string) (any, error) {
	switch t {
	case Bool:
		if s == "" {
			return false, nil
		}
		return strconv.ParseBool(s)
	case Int:
		if s == "" {
			return 0, nil
		}
		return strconv.Atoi(s)
	case Float:
		if s == "" {
			return 0.0, nil
		}
		return strconv.ParseFloat(s, 64)
	case Ints:
		out := []int{}
		if s == "" {
			return out, nil
		}
		for _, p := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil {
				return nil, err
			}
			out = append(out, n)
		}
		return out, nil
	case PathType:
		return Path(s), nil
	}
	return s, nil
}

// Schema is the option declaration of the pass d describes, p an instance
// of it: derived from p's options struct (WithOptions), else d.Options.
func Schema(d Description, p Pass) ([]Option, error) {
	wo, ok := p.(WithOptions)
	if !ok {
		return d.Options, nil
	}
	v := reflect.ValueOf(wo.Options())
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return nil, fmt.Errorf("pass %s: Options must return a non-nil pointer to a struct", d.Name)
	}
	opts, _, err := optionFields(v.Elem().Type())
	if err != nil {
		return nil, fmt.Errorf("pass %s: %w", d.Name, err)
	}
	return opts, nil
}

// DescriptionOf is d with the options of its schema (Schema(d, p)).
func DescriptionOf(d Description, p Pass) (Description, error) {
	opts, err := Schema(d, p)
	d.Options = opts
	return d, err
}

// Normalize checks opts against a schema and returns every option with its
// value: the given one, decoded strictly into the option's type, or the
// default. Relative Path values are joined to dir (the directory of the
// configuration file they were written in; "" leaves them as they are).
// Errors name the option.
func Normalize(schema []Option, opts map[string]any, dir string) (map[string]any, error) {
	out := make(map[string]any, len(schema))
	known := map[string]Option{}
	for _, o := range schema {
		known[o.Name] = o
		out[o.Name] = o.Default
	}
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		o, ok := known[k]
		if !ok {
			var names []string
			for _, x := range schema {
				names = append(names, x.Name)
			}
			if len(names) == 0 {
				return nil, fmt.Errorf("unknown option %q (the pass has no options)", k)
			}
			return nil, fmt.Errorf("unknown option %q (options: %s)", k, strings.Join(names, ", "))
		}
		v, err := decodeOption(o, opts[k])
		if err != nil {
			return nil, fmt.Errorf("option %s: %w", k, err)
		}
		if p, ok := v.(Path); ok && p != "" && dir != "" && !filepath.IsAbs(string(p)) {
			v = Path(filepath.Join(dir, string(p)))
		}
		out[k] = v
	}
	return out, nil
}

// decodeOption converts one configured value to its option's type without
// reinterpreting it (internal/strict: no float becomes an int, no bool a
// number).
func decodeOption(o Option, v any) (any, error) {
	t, ok := goType(o.Type)
	if !ok {
		return nil, fmt.Errorf("unknown option type %q", o.Type)
	}
	if v == nil {
		return nil, fmt.Errorf("want %s, got nothing", o.Type)
	}
	dst := reflect.New(t)
	dc := &mapstructure.DecoderConfig{Result: dst.Interface(), DecodeHook: strict.Hook}
	dec, err := mapstructure.NewDecoder(dc)
	if err != nil {
		return nil, err
	}
	if err := dec.Decode(v); err != nil {
		return nil, fmt.Errorf("want %s, got %T (%v): %s", o.Type, v, v, strict.Message(err))
	}
	out := dst.Elem().Interface()
	if len(o.Enum) > 0 {
		if s, _ := out.(string); !slices.Contains(o.Enum, s) {
			return nil, fmt.Errorf("%q is not one of %s", s, strings.Join(o.Enum, ", "))
		}
	}
	return out, nil
}

// Configure gives p, an instance of the pass d describes, its options:
// checked against its schema (Schema(d, p)) and defaulted
// (Normalize), then decoded into its options struct (WithOptions, whose
// Validate runs if it has one) or handed to Configure (Configurable). A
// pass with neither takes no options. Errors name the option, not the pass
// (callers say which pass they configured).
func Configure(d Description, p Pass, opts map[string]any, dir string) error {
	schema, err := Schema(d, p)
	if err != nil {
		return err
	}
	norm, err := Normalize(schema, opts, dir)
	if err != nil {
		return err
	}
	switch q := p.(type) {
	case WithOptions:
		v := reflect.ValueOf(q.Options()).Elem()
		_, idx, _ := optionFields(v.Type())
		for i, o := range schema {
			v.Field(idx[i]).Set(reflect.ValueOf(norm[o.Name]).Convert(v.Field(idx[i]).Type()))
		}
		if val, ok := q.Options().(Validator); ok {
			if err := val.Validate(); err != nil {
				return err
			}
		}
	case Configurable:
		return q.Configure(norm)
	}
	return nil
}
