package pass

import (
	"testing"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/stretchr/testify/require"
)

type typedOptions struct {
	On    bool    `option:"on" default:"true" doc:"switch"`
	N     int     `option:"n" default:"3" doc:"count"`
	Tol   float64 `option:"tol" default:"1e-4"`
	Mode  string  `option:"mode" default:"a" enum:"a,b" doc:"which"`
	Xs    []int   `option:"xs" default:"1,8"`
	Dir   Path    `option:"dir" default:"tables"`
	Notes string  // untagged: not an option
}

func (o *typedOptions) Validate() error {
	if o.N > 100 {
		return errTooMany
	}
	return nil
}

var errTooMany = errString("n must be ≤ 100")

type errString string

func (e errString) Error() string { return string(e) }

type typed struct {
	opts typedOptions
}

var typedDesc = Description{Name: "t-typed", Version: "1"}

func (p *typed) Options() any                             { return &p.opts }
func (*typed) Eligible(*ir.Graph, *Analyses, *Env) []Site { return nil }
func (*typed) Apply(*ir.Graph, []Site) (Result, error)    { return Result{}, nil }

// The schema comes from the options struct's tags; defaults are typed.
func TestSchemaIsDerivedFromTheOptionsStruct(t *testing.T) {
	d, err := DescriptionOf(typedDesc, &typed{})
	require.NoError(t, err)
	require.Equal(t, []Option{
		{Name: "on", Type: Bool, Default: true, Doc: "switch"},
		{Name: "n", Type: Int, Default: 3, Doc: "count"},
		{Name: "tol", Type: Float, Default: 1e-4},
		{Name: "mode", Type: String, Default: "a", Doc: "which", Enum: []string{"a", "b"}},
		{Name: "xs", Type: Ints, Default: []int{1, 8}},
		{Name: "dir", Type: PathType, Default: Path("tables")},
	}, d.Options)
}

// Configure sets defaults, decodes strictly, resolves relative paths against
// the configuration file's directory and runs Validate.
func TestConfigureDecodesStrictly(t *testing.T) {
	p := &typed{}
	p.opts.N = 99 // overwritten by the default
	require.NoError(t, Configure(typedDesc, p, nil, "/etc/glmflash"))
	require.Equal(t, typedOptions{On: true, N: 3, Tol: 1e-4, Mode: "a", Xs: []int{1, 8}, Dir: "tables"}, p.opts, "defaults are not paths written in a file")

	require.NoError(t, Configure(typedDesc, p, map[string]any{"on": false, "n": int64(7), "tol": 1, "mode": "b", "xs": []any{2, 4}, "dir": "t2"}, "/etc/glmflash"))
	require.Equal(t, typedOptions{On: false, N: 7, Tol: 1, Mode: "b", Xs: []int{2, 4}, Dir: "/etc/glmflash/t2"}, p.opts)
	require.NoError(t, Configure(typedDesc, p, map[string]any{"dir": "/abs"}, "/etc/glmflash"))
	require.Equal(t, Path("/abs"), p.opts.Dir)

	for opts, want := range map[*map[string]any]string{
		{"n": 2.7}:            "option n: want int",
		{"n": 3.0}:            "option n: want int",
		{"n": true}:           "option n: want int",
		{"on": 1}:             "option on: want bool",
		{"on": "yes"}:         "option on: want bool",
		{"xs": []any{1, 2.5}}: "option xs: want []int",
		{"mode": "c"}:         `option mode: "c" is not one of a, b`,
		{"nn": 1}:             `unknown option "nn" (options: on, n, tol, mode, xs, dir)`,
		{"n": 101}:            "n must be ≤ 100",
		{"mode": nil}:         "option mode: want string, got nothing",
	} {
		require.ErrorContains(t, Configure(typedDesc, &typed{}, *opts, ""), want)
	}
}

type badOptions struct {
	M map[string]int `option:"m"`
}
type badDefault struct {
	N int `option:"n" default:"x"`
}
type badEnum struct {
	S string `option:"s" default:"c" enum:"a,b"`
}

type withOpts struct {
	typed
	o any
}

func (p *withOpts) Options() any { return p.o }

// A malformed options declaration is refused by name.
func TestSchemaRefusesBadDeclarations(t *testing.T) {
	for o, want := range map[any]string{
		&badOptions{}: "field type map[string]int",
		&badDefault{}: "option n: default",
		&badEnum{}:    `default "c" is not one of a, b`,
		nil:           "non-nil pointer",
	} {
		_, err := Schema(typedDesc, &withOpts{o: o})
		require.ErrorContains(t, err, want)
	}
	stated := Description{Name: "t-bad-schema", Version: "1", Summary: "s", Verify: "v", Draft: "d"}
	require.Panics(t, func() { Register(stated, func() Pass { return &withOpts{o: &badDefault{}} }) })
}

// A description that leaves out what every pass states is refused at
// registration, by name.
func TestRegisterRefusesIncompleteDescriptions(t *testing.T) {
	ok := Description{Name: "t-incomplete", Version: "1", Summary: "s", Verify: "v", Draft: "d"}
	for _, edit := range []func(*Description){
		func(d *Description) { d.Name = "" },
		func(d *Description) { d.Version = "" },
		func(d *Description) { d.Summary = "" },
		func(d *Description) { d.Verify = "" },
		func(d *Description) { d.Draft = "" },
	} {
		d := ok
		edit(&d)
		require.Panics(t, func() { Register(d, func() Pass { return &typed{} }) })
	}
	_, registered := Lookup(ok.Name)
	require.False(t, registered)
}

type plain struct{ typed }

func (*plain) Options() {} // not pass.WithOptions's signature: no options

// A pass without options refuses every option.
func TestPassWithoutOptions(t *testing.T) {
	require.NoError(t, Configure(typedDesc, &plain{}, nil, ""))
	require.ErrorContains(t, Configure(typedDesc, &plain{}, map[string]any{"x": 1}, ""), `unknown option "x" (the pass has no options)`)
}

// Statistics are declared once, as a tagged struct.
func TestCounters(t *testing.T) {
	type stats struct {
		Fused   int   `stat:"fused" doc:"boundaries fused"`
		Removed int64 `stat:"removed"`
		note    string
	}
	require.Equal(t, []Statistic{{Name: "fused", Value: 3, Doc: "boundaries fused"}, {Name: "removed", Value: 9}},
		Counters(&stats{Fused: 3, Removed: 9, note: "x"}))
	require.Panics(t, func() {
		Counters(&struct {
			S string `stat:"s"`
		}{})
	})
}
