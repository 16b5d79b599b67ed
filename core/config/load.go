package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/v2"

	"github.com/glmflash/glmflash/internal/regular"
	"github.com/glmflash/glmflash/internal/strict"
)

// The one loader of every configuration glmflash reads (the engine and
// serving file, studies): layers of keys, each later one overriding the
// earlier ones (built-in defaults → the file → the environment → flags),
// decoded strictly into a struct with koanf tags. A key that the struct
// does not have, a value of the wrong type (true for a number, 2.7 for an
// integer, 30 for a duration) or one that fails validation is an error
// naming the key and the layer it came from ("runtime.slots (environment
// variable GLMFLASH_RUNTIME__SLOTS): …"). String fields tagged `path:""`
// are file names: a relative one written in a file is relative to that
// file's directory, one from the environment or a flag to the working
// directory.

// EnvPrefix starts the environment variables that set configuration keys:
// GLMFLASH_ and the key's path with "__" between levels, upper case
// (GLMFLASH_RUNTIME__SLOTS=32 sets runtime.slots, GLMFLASH_DEVICE=cuda sets
// device). A variable with the prefix that neither contains "__" nor names
// a top-level key is not configuration (GLMFLASH_CUDA_EMULATOR and the
// other developer switches) and is ignored.
const EnvPrefix = "GLMFLASH_"

// Layer is one source of configuration keys.
type Layer struct {
	// Name says where the keys come from in messages: "built-in
	// configs/serve.yaml", a file's path, "environment variable X", "flag
	// --port" (per key for the environment and flags).
	Name string
	// Dir is the directory relative paths of this layer are relative to
	// ("": the working directory).
	Dir   string
	k     *koanf.Koanf
	names map[string]string // per-key names (environment variables, flags)
}

// BytesLayer parses YAML bytes; name says where they come from and dir is
// where their relative paths point from.
func BytesLayer(name, dir string, b []byte) (Layer, error) {
	raw, err := yaml.Parser().Unmarshal(b)
	if err != nil {
		return Layer{}, fmt.Errorf("%s: invalid YAML: %w", name, err)
	}
	if err := dottedKey(raw, ""); err != nil {
		return Layer{}, fmt.Errorf("%s: %w", name, err)
	}
	k := koanf.New(".")
	if err := k.Load(rawbytes.Provider(b), yaml.Parser()); err != nil {
		return Layer{}, fmt.Errorf("%s: invalid YAML: %w", name, err)
	}
	return Layer{Name: name, Dir: dir, k: k}, nil
}

// dottedKey refuses a mapping key with a dot ("runtime.slots: 4"): keys
// are split on dots when the layers merge, so such a key named no field
// and the decoder answered with a Go type ("config.Config: has unknown
// key(s)"); the error names the key and where it is, and says to nest it.
func dottedKey(v any, at string) error {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for key := range x {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			if strings.Contains(key, ".") {
				where := "at the top level"
				if at != "" {
					where = "in " + at
				}
				first, rest, _ := strings.Cut(key, ".")
				return fmt.Errorf("key %q %s has a dot: keys are not split on dots in a file; nest it (%s: then %s: under it)", key, where, first, rest)
			}
			p := key
			if at != "" {
				p = at + "." + key
			}
			if err := dottedKey(x[key], p); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range x {
			if err := dottedKey(e, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// FileLayer reads a YAML file (a regular file of bounded size); relative
// paths in it are relative to its directory.
func FileLayer(path string) (Layer, error) {
	b, err := regular.ReadFile(path, regular.ConfigLimit)
	if err != nil {
		return Layer{}, fmt.Errorf("config: %w", err)
	}
	return BytesLayer(path, filepath.Dir(path), b)
}

// EnvLayer holds the configuration variables of environ (os.Environ's
// format; nil means os.Environ()) for a struct whose top-level keys are
// those of dst.
func EnvLayer(environ []string, dst any) Layer {
	if environ == nil {
		environ = os.Environ()
	}
	top := map[string]bool{}
	t := reflect.TypeOf(dst).Elem()
	for i := 0; i < t.NumField(); i++ {
		if tag := t.Field(i).Tag.Get("koanf"); tag != "" && tag != "-" {
			top[tag] = true
		}
	}
	k := koanf.New(".")
	names := map[string]string{}
	for _, kv := range environ {
		name, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) {
			continue
		}
		rest := strings.TrimPrefix(name, EnvPrefix)
		key := strings.ToLower(strings.ReplaceAll(rest, "__", "."))
		if !strings.Contains(rest, "__") && !top[key] {
			continue // not configuration
		}
		_ = k.Set(key, strict.Env(v)) // text, parsed into its field's type; koanf.Set fails only for a nil Koanf
		names[key] = "environment variable " + name
	}
	return Layer{Name: "the environment", k: k, names: names}
}

// Flag is one configuration key given on the command line.
type Flag struct {
	Key   string // "model.dir"
	Value any
	Name  string // "--model", for messages
}

// FlagLayer holds keys set by command-line flags.
func FlagLayer(flags []Flag) Layer {
	k := koanf.New(".")
	names := map[string]string{}
	for _, f := range flags {
		v := f.Value
		if str, ok := v.(string); ok {
			v = strict.Env(str) // command-line text, parsed like an environment variable's
		}
		_ = k.Set(f.Key, v)
		names[f.Key] = "flag " + f.Name
	}
	return Layer{Name: "flags", k: k, names: names}
}

// Sources says which layer gave each key.
type Sources struct {
	layers []Layer
	of     map[string]int // key → index in layers
}

// layer returns the layer that set key or the closest section above it
// (-1: none).
func (s *Sources) layer(key string) int {
	key = indexRE.ReplaceAllString(key, "")
	for {
		if i, ok := s.of[key]; ok {
			return i
		}
		dot := strings.LastIndex(key, ".")
		if dot < 0 {
			best := -1
			for k, i := range s.of { // a section: the latest layer that set a key in it
				if strings.HasPrefix(k, key+".") && i > best {
					best = i
				}
			}
			return best
		}
		key = key[:dot]
	}
}

// Of names where key's value came from ("" if it came from no layer).
func (s *Sources) Of(key string) string {
	i := s.layer(key)
	if i < 0 {
		return ""
	}
	l := s.layers[i]
	for k := key; ; {
		if n, ok := l.names[indexRE.ReplaceAllString(k, "")]; ok {
			return n
		}
		dot := strings.LastIndex(k, ".")
		if dot < 0 {
			return l.Name
		}
		k = k[:dot]
	}
}

// Dir is the directory key's relative paths are relative to ("" for the
// working directory).
func (s *Sources) Dir(key string) string {
	if i := s.layer(key); i >= 0 {
		return s.layers[i].Dir
	}
	return ""
}

// Exclusive names keys of which the latest layer wins as a group: a layer
// setting one of them drops the others set by earlier layers (model.dir
// replaces a default model.preset); one layer setting two is an error.
type Exclusive []string

// Decode merges layers (last wins) into dst, a pointer to a struct with
// koanf tags, strictly (see above), resolves its path fields and returns
// where each key came from. exclusive lists groups of keys that replace
// each other.
func Decode(dst any, layers []Layer, exclusive ...Exclusive) (*Sources, error) {
	src := &Sources{layers: layers, of: map[string]int{}}
	k := koanf.New(".")
	for i, l := range layers {
		for _, g := range exclusive {
			var here []string
			for _, key := range g {
				if l.k.Exists(key) {
					here = append(here, key)
				}
			}
			if len(here) > 1 {
				return src, fmt.Errorf("%s: %s are mutually exclusive", l.Name, strings.Join(here, " and "))
			}
			if len(here) == 1 {
				for _, key := range g {
					if key != here[0] {
						k.Delete(key)
						delete(src.of, key)
					}
				}
			}
		}
		if err := k.Merge(l.k); err != nil {
			return src, fmt.Errorf("%s: %w", l.Name, err)
		}
		for _, key := range l.k.Keys() {
			src.of[key] = i
		}
	}
	t := reflect.TypeOf(dst).Elem()
	leaves, maps, sections := map[string]bool{}, map[string]bool{}, map[string]bool{}
	collectKeys(t, "", leaves, maps, sections)
	var unknown []string
	for _, key := range k.Keys() {
		switch {
		case leaves[key] || underMap(key, maps):
		case sections[key]:
			if _, isMap := k.Get(key).(map[string]any); isMap {
				continue // an empty section
			}
			unknown = append(unknown, fmt.Sprintf("%q must be a section (a mapping), in %s", key, src.Of(key)))
		default:
			msg := fmt.Sprintf("unknown key %q in %s", key, src.Of(key))
			if strings.HasPrefix(key, "engine_") {
				msg += " (engine keys have no ENGINE_ in their variables: GLMFLASH_" + strings.ToUpper(strings.ReplaceAll(strings.TrimPrefix(key, "engine_"), ".", "__")) + ")"
			}
			unknown = append(unknown, msg)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return src, fmt.Errorf("%s", strings.Join(unknown, "; "))
	}
	dc := strict.DecoderConfig(dst)
	dc.DecodeHook = strict.Hook // splits an environment variable's list itself
	if err := k.UnmarshalWithConf("", dst, koanf.UnmarshalConf{Tag: "koanf", DecoderConfig: dc}); err != nil {
		return src, src.annotate(err)
	}
	resolvePaths(reflect.ValueOf(dst).Elem(), "", src)
	return src, nil
}

var (
	indexRE = regexp.MustCompile(`\[\d+\]`)
	quoted  = regexp.MustCompile(`'([A-Za-z0-9_.\[\]-]+)'`)
)

// annotate rewrites a decoding error one problem a line, each naming the
// key it concerns and where that key came from.
func (s *Sources) annotate(err error) error {
	var lines []string
	var walk func(e error)
	walk = func(e error) {
		var de *mapstructure.DecodeError
		switch x := e.(type) {
		case interface{ Unwrap() []error }:
			for _, c := range x.Unwrap() {
				walk(c)
			}
		case *mapstructure.DecodeError:
			de = x
			lines = append(lines, s.keyError(de.Name(), de.Unwrap()).Error())
		default:
			if u := errors.Unwrap(e); u != nil {
				walk(u)
				return
			}
			msg := strict.Message(e)
			if m := quoted.FindStringSubmatch(msg); m != nil {
				if where := s.Of(m[1]); where != "" {
					msg += " (" + where + ")"
				}
			}
			lines = append(lines, msg)
		}
	}
	walk(err)
	return errors.New(strings.Join(lines, "; "))
}

// keyError is "key (source): err".
func (s *Sources) keyError(key string, err error) error {
	if where := s.Of(key); where != "" {
		return fmt.Errorf("%s (%s): %s", key, where, strict.Message(err))
	}
	return fmt.Errorf("%s: %s", key, strict.Message(err))
}

// KeyError is a validation error about one key; Decode's callers annotate
// it with the key's source (Sources.Explain).
type KeyError struct {
	Key string
	Err error
}

func (e *KeyError) Error() string { return e.Key + ": " + e.Err.Error() }

func (e *KeyError) Unwrap() error { return e.Err }

// keyErr makes a KeyError.
func keyErr(key, format string, args ...any) error {
	return &KeyError{Key: key, Err: fmt.Errorf(format, args...)}
}

// Explain adds the source of a KeyError's key to its message.
func (s *Sources) Explain(err error) error {
	var ke *KeyError
	if s == nil || !errors.As(err, &ke) {
		return err
	}
	return s.keyError(ke.Key, ke.Err)
}

var durationType = reflect.TypeOf(time.Duration(0))

// collectKeys lists the dotted keys of a config struct: leaves (scalars,
// lists), maps (whose sub-keys are free) and sections (structs).
func collectKeys(t reflect.Type, prefix string, leaves, maps, sections map[string]bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("koanf")
		if tag == "" || tag == "-" {
			continue
		}
		key := prefix + tag
		switch {
		case f.Type.Kind() == reflect.Struct && f.Type != durationType:
			sections[key] = true
			collectKeys(f.Type, key+".", leaves, maps, sections)
		case f.Type.Kind() == reflect.Pointer && f.Type.Elem().Kind() == reflect.Struct: // an optional section
			sections[key] = true
			collectKeys(f.Type.Elem(), key+".", leaves, maps, sections)
		case f.Type.Kind() == reflect.Map:
			maps[key] = true
		default:
			leaves[key] = true
		}
	}
}

func underMap(key string, maps map[string]bool) bool {
	for m := range maps {
		if key == m || strings.HasPrefix(key, m+".") {
			return true
		}
	}
	return false
}

// resolvePaths joins every relative path field (tag `path:""`) to the
// directory of the layer that set it.
func resolvePaths(v reflect.Value, prefix string, src *Sources) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("koanf")
		if tag == "" || tag == "-" {
			continue
		}
		key := prefix + tag
		fv := v.Field(i)
		switch {
		case f.Type.Kind() == reflect.Struct && f.Type != durationType:
			resolvePaths(fv, key+".", src)
		case f.Type.Kind() == reflect.Pointer && f.Type.Elem().Kind() == reflect.Struct:
			if !fv.IsNil() {
				resolvePaths(fv.Elem(), key+".", src)
			}
		case f.Type.Kind() == reflect.String:
			if _, isPath := f.Tag.Lookup("path"); isPath && fv.String() != "" && !filepath.IsAbs(fv.String()) {
				if dir := src.Dir(key); dir != "" {
					fv.SetString(filepath.Join(dir, fv.String()))
				}
			}
		}
	}
}
