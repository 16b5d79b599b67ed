package chat

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/nikolalohinski/gonja/v2/builtins"
	controlStructures "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
)

// Limits bound one rendering of a chat template (gonja has none of its
// own: a macro that calls itself overflowed the Go stack, which kills the
// process, and range(10**9) or a string doubled in a loop exhausted the
// memory).
type Limits struct {
	// MaxDepth bounds the nesting of macro calls, control structures and
	// filter calls (a macro calling itself is an error at this depth).
	MaxDepth int
	// MaxRange bounds the length of range() (transformers' jinja2 sandbox:
	// MAX_RANGE = 100000).
	MaxRange int
	// MaxOutput bounds the rendered prompt, and every string a macro or a
	// filter returns, in bytes.
	MaxOutput int
	// Timeout bounds the time of one rendering.
	Timeout time.Duration
}

// DefaultLimits are the sandbox's limits: far above what real chat
// templates need (their nesting is under 10, their output the
// conversation plus a few hundred bytes a message), far below what hurts
// the server.
var DefaultLimits = Limits{MaxDepth: 64, MaxRange: 100_000, MaxOutput: 32 << 20, Timeout: 5 * time.Second}

// ErrLimit is wrapped by the errors of a rendering stopped by a limit.
var ErrLimit = errors.New("chat template: over the sandbox's limit")

// guardKey is where a rendering's guard sits in the template's context.
const guardKey = "__glmflash_sandbox__"

// guard is the state of one rendering.
type guard struct {
	ctx      context.Context
	lim      Limits
	deadline time.Time
	depth    int
	err      error // the first limit passed or the context's end; sticky
}

// check returns the error that stops the rendering, if any: the context
// done, the time passed, or an earlier one.
func (g *guard) check() error {
	if g.err != nil {
		return g.err
	}
	if err := context.Cause(g.ctx); err != nil {
		g.err = fmt.Errorf("chat template: rendering stopped: %w", err)
	} else if time.Now().After(g.deadline) {
		g.err = fmt.Errorf("%w: rendering took more than %v", ErrLimit, g.lim.Timeout)
	}
	return g.err
}

func (g *guard) fail(format string, args ...any) error {
	if g.err == nil {
		g.err = fmt.Errorf("%w: "+format, append([]any{ErrLimit}, args...)...)
	}
	return g.err
}

// enter is called before a nested evaluation; leave after it.
func (g *guard) enter(what string) error {
	if err := g.check(); err != nil {
		return err
	}
	g.depth++
	if g.depth > g.lim.MaxDepth {
		return g.fail("%s nested more than %d deep (a macro calling itself?)", what, g.lim.MaxDepth)
	}
	return nil
}

func (g *guard) leave() { g.depth-- }

func (g *guard) checkString(what string, v *exec.Value) error {
	if v != nil && v.IsString() && len(v.String()) > g.lim.MaxOutput {
		return g.fail("%s made a string of more than %d bytes", what, g.lim.MaxOutput)
	}
	return nil
}

func guardOf(ctx *exec.Context) *guard {
	v, ok := ctx.Get(guardKey)
	if !ok {
		return nil
	}
	g, _ := v.(*guard)
	return g
}

// writer is the rendering's output: bounded, and checking the guard at
// every write (a loop that writes, however empty, stops when asked).
type writer struct {
	g  *guard
	sb strings.Builder
}

func (w *writer) Write(p []byte) (int, error) {
	if err := w.g.check(); err != nil {
		return 0, err
	}
	if w.sb.Len()+len(p) > w.g.lim.MaxOutput {
		return 0, w.g.fail("the prompt is longer than %d bytes", w.g.lim.MaxOutput)
	}
	return w.sb.Write(p)
}

// render executes the template with data in the sandbox.
func (t *Template) render(ctx context.Context, data map[string]any) (out string, err error) {
	lim := t.limits
	g := &guard{ctx: ctx, lim: lim, deadline: time.Now().Add(lim.Timeout)}
	if err := g.check(); err != nil {
		return "", err
	}
	data[guardKey] = g
	data["range"] = g.rangeFunction
	data["lipsum"] = g.lipsumFunction
	w := &writer{g: g}
	defer func() {
		if p := recover(); p != nil { // gonja's, on input it did not expect
			out, err = "", fmt.Errorf("chat template: %v", p)
		}
	}()
	if err := t.tmpl.Execute(w, exec.NewContext(data)); err != nil {
		if g.err != nil {
			return "", g.err // the cause, not gonja's wrapping of it
		}
		if strings.Contains(err.Error(), ErrLimit.Error()) {
			// a string method's refusal: gonja keeps only its text
			return "", fmt.Errorf("%w (%v)", ErrLimit, err)
		}
		return "", fmt.Errorf("chat template: %w", err)
	}
	if g.err != nil {
		return "", g.err
	}
	return w.sb.String(), nil
}

// rangeFunction is Jinja's range, as a list of at most MaxRange numbers
// (gonja's streams them from a goroutine that is never ended when the loop
// stops early).
func (g *guard) rangeFunction(_ *exec.Evaluator, params *exec.VarArgs) ([]int, error) {
	if err := g.check(); err != nil {
		return nil, err
	}
	start, stop, step := 0, 0, 1
	args := params.Args
	for _, a := range args {
		if !a.IsInteger() {
			return nil, errors.New("range: the arguments must be integers")
		}
	}
	if len(params.KwArgs) > 0 {
		return nil, errors.New("range: takes no keyword arguments")
	}
	switch len(args) {
	case 1:
		stop = args[0].Integer()
	case 2:
		start, stop = args[0].Integer(), args[1].Integer()
	case 3:
		start, stop, step = args[0].Integer(), args[1].Integer(), args[2].Integer()
	default:
		return nil, errors.New("range: expected [start, ]stop[, step]")
	}
	if step == 0 {
		return nil, errors.New("range: step cannot be 0")
	}
	var n uint64 // in unsigned arithmetic, which cannot overflow here
	if step > 0 && stop > start {
		n = (uint64(stop)-uint64(start)-1)/uint64(step) + 1
	} else if step < 0 && stop < start {
		n = (uint64(start)-uint64(stop)-1)/(uint64(-(step+1))+1) + 1
	}
	if n > uint64(g.lim.MaxRange) {
		return nil, g.fail("range of %d numbers (at most %d)", n, g.lim.MaxRange)
	}
	out := make([]int, n)
	for i := range out {
		out[i] = start + i*step
	}
	return out, nil
}

// Bounds of lipsum's arguments (Jinja's defaults are 5 paragraphs of 20 to
// 100 words).
const (
	maxLipsumParagraphs = 100
	maxLipsumWords      = 1000
)

var builtinLipsum = func() func(*exec.Evaluator, *exec.VarArgs) *exec.Value {
	v, _ := builtins.GlobalFunctions.Get("lipsum")
	f, _ := v.(func(*exec.Evaluator, *exec.VarArgs) *exec.Value)
	return f
}()

// lipsumFunction is Jinja's lipsum with bounded arguments.
func (g *guard) lipsumFunction(e *exec.Evaluator, params *exec.VarArgs) *exec.Value {
	if err := g.check(); err != nil {
		return exec.AsValue(err)
	}
	bound := func(v *exec.Value, name string, max int) error {
		if v != nil && v.IsInteger() && (v.Integer() > max || v.Integer() < 0) {
			return g.fail("lipsum: %s = %d (at most %d)", name, v.Integer(), max)
		}
		return nil
	}
	names := []string{"n", "html", "min", "max"}
	for i, a := range params.Args {
		if i < len(names) && names[i] != "html" {
			max := maxLipsumWords
			if names[i] == "n" {
				max = maxLipsumParagraphs
			}
			if err := bound(a, names[i], max); err != nil {
				return exec.AsValue(err)
			}
		}
	}
	for k, a := range params.KwArgs {
		max := maxLipsumWords
		if k == "n" {
			max = maxLipsumParagraphs
		}
		if k != "html" {
			if err := bound(a, k, max); err != nil {
				return exec.AsValue(err)
			}
		}
	}
	if builtinLipsum == nil {
		return exec.AsValue(errors.New("lipsum: not available"))
	}
	return builtinLipsum(e, params)
}

// refused are the control structures a chat template may not use: they
// read files, or (block, through self) recurse where no limit can see.
var refused = map[string]string{
	"extends": "chat templates cannot read files",
	"include": "chat templates cannot read files",
	"import":  "chat templates cannot read files",
	"from":    "chat templates cannot read files",
	"block":   "blocks are not supported in chat templates",
}

var (
	envOnce sync.Once
	env     *exec.Environment
)

// sandboxEnvironment is gonja's default environment with every control
// structure and filter wrapped in the guard's checks, the control
// structures that read files refused, and recursive for loops refused
// (their recursion goes through no hook a limit could use).
func sandboxEnvironment() *exec.Environment {
	envOnce.Do(func() {
		cs := exec.NewControlStructureSet(map[string]parser.ControlStructureParser{})
		for _, name := range setKeys(controlStructures.All, "statements") {
			name := name
			if why, ok := refused[name]; ok {
				_ = cs.Register(name, func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
					return nil, args.Error(fmt.Sprintf("{%% %s %%}: %s", name, why), nil)
				})
				continue
			}
			inner, _ := controlStructures.All.Get(name)
			_ = cs.Register(name, func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
				n, err := inner(p, args)
				if err != nil {
					return nil, err
				}
				if f, ok := n.(*controlStructures.ForControlStructure); ok && f.Recursive {
					return nil, args.Error("recursive for loops are not supported in chat templates", nil)
				}
				x, ok := n.(exec.ControlStructure)
				if !ok {
					return n, nil
				}
				if m, ok := n.(*controlStructures.MacroControlStructure); ok {
					return &guardedMacro{x, m.Name}, nil
				}
				g := &guarded{ControlStructure: x, name: name}
				if s, ok := n.(*controlStructures.SetControlStructure); ok {
					// {% set ns.a = ns %} makes a map that holds itself, and
					// printing it overflows the Go stack: the target is
					// looked at after each assignment to an attribute or item.
					f := reflect.ValueOf(s).Elem().FieldByName("target")
					if f.IsValid() {
						t, _ := reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(nodes.Expression)
						var container nodes.Node
						switch t := t.(type) {
						case *nodes.GetAttribute:
							container = t.Node
						case *nodes.GetItem:
							container = t.Node
						}
						if e, ok := container.(nodes.Expression); ok {
							g.target, g.container = t, e
						}
					}
				}
				return g, nil
			})
		}
		fs := exec.NewFilterSet(map[string]exec.FilterFunction{mulFilter: func(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
			g := guardOf(e.Environment.Context)
			if g == nil {
				return exec.AsValue(errors.New("chat template: no sandbox"))
			}
			return multiply(g, in, params)
		}})
		for _, name := range setKeys(builtins.Filters, "filters") {
			name := name
			inner, _ := builtins.Filters.Get(name)
			if name == "tojson" {
				inner = toJSON
			}
			_ = fs.Register(name, func(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
				g := guardOf(e.Environment.Context)
				if g == nil {
					return exec.AsValue(errors.New("chat template: no sandbox"))
				}
				if err := g.enter("filters"); err != nil {
					return exec.AsValue(err)
				}
				defer g.leave()
				if err := checkArgs(g, name, params); err != nil {
					return exec.AsValue(err)
				}
				if err := g.checkString("the input of filter "+name, in); err != nil {
					return exec.AsValue(err)
				}
				if name == "replace" && len(params.Args) >= 2 && in.IsString() {
					// The product is allocated before it can be looked at.
					s, old, repl := in.String(), params.Args[0].String(), params.Args[1].String()
					n := strings.Count(s, old)
					if n > 0 && len(repl) > len(old) && (len(repl)-len(old)) > (g.lim.MaxOutput-len(s))/n {
						return exec.AsValue(g.fail("filter replace would make more than %d bytes", g.lim.MaxOutput))
					}
				}
				out := inner(e, in, params)
				if err := g.checkString("filter "+name, out); err != nil {
					return exec.AsValue(err)
				}
				return out
			})
		}
		env = &exec.Environment{
			Context:           exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables),
			Filters:           fs,
			Tests:             builtins.Tests,
			ControlStructures: cs,
			Methods:           guardedMethods(builtins.Methods),
		}
	})
	return env
}

// guardedMethods wraps the string methods (s.replace, s.center, s.join …),
// which receive no context a guard could be found in: an integer argument
// over the output limit (a width) is refused, replace's product is bounded
// before it is allocated, and a result longer than the limit is an error.
// List and dict methods make no strings (their growth is bounded by the
// loops that drive them, which the guard counts).
func guardedMethods(m exec.Methods) exec.Methods {
	max := DefaultLimits.MaxOutput
	str := map[string]exec.Method[string]{}
	for _, name := range setKeys(m.Str, "methods") {
		inner, _ := m.Str.Get(name)
		str[name] = func(self string, sv *exec.Value, args *exec.VarArgs) (any, error) {
			if err := checkMethodArgs(name, self, args, max); err != nil {
				return nil, err
			}
			out, err := inner(self, sv, args)
			if s, ok := out.(string); ok && len(s) > max {
				return nil, fmt.Errorf("%w: method %s made a string of more than %d bytes", ErrLimit, name, max)
			}
			return out, err
		}
	}
	m.Str = exec.NewMethodSet(str)
	return m
}

// checkMethodArgs is guardedMethods' check before a string method runs.
func checkMethodArgs(name, self string, args *exec.VarArgs, max int) error {
	for _, v := range args.Args {
		if v != nil && (v.IsInteger() && v.Integer() > max || v.IsFloat() && v.Float() > float64(max)) {
			return fmt.Errorf("%w: method %s: argument %v is more than %d", ErrLimit, name, v.Interface(), max)
		}
	}
	if name == "replace" && len(args.Args) >= 2 && args.Args[0].IsString() && args.Args[1].IsString() {
		old, repl := args.Args[0].String(), args.Args[1].String()
		n := strings.Count(self, old) // len(self)+1 for an empty old
		if n > 0 && len(repl) > len(old) && (len(repl)-len(old)) > (max-len(self))/n {
			return fmt.Errorf("%w: method replace would make more than %d bytes", ErrLimit, max)
		}
	}
	if name == "join" && len(args.Args) >= 1 {
		// the separator repeated once per item
		if l := args.Args[0]; l.IsList() && len(self) > 0 && l.Len() > max/len(self) {
			return fmt.Errorf("%w: method join would make more than %d bytes", ErrLimit, max)
		}
	}
	return nil
}

// checkArgs refuses a filter's integer argument larger than the output
// limit (center(10**9), indent(10**9) …: a width is a length to allocate).
func checkArgs(g *guard, name string, params *exec.VarArgs) error {
	check := func(v *exec.Value) error {
		if v != nil && (v.IsInteger() && v.Integer() > g.lim.MaxOutput || v.IsFloat() && v.Float() > float64(g.lim.MaxOutput)) {
			return g.fail("filter %s: argument %v is more than %d", name, v.Interface(), g.lim.MaxOutput)
		}
		return nil
	}
	for _, a := range params.Args {
		if err := check(a); err != nil {
			return err
		}
	}
	for _, a := range params.KwArgs {
		if err := check(a); err != nil {
			return err
		}
	}
	return nil
}

// setKeys lists the names in one of gonja's registries (it has no
// accessor for them), sorted.
func setKeys(set any, field string) []string {
	m := reflect.ValueOf(set).Elem().FieldByName(field)
	var out []string
	for _, k := range m.MapKeys() {
		out = append(out, k.String())
	}
	sort.Strings(out)
	return out
}

// guarded is a control structure run within the guard's depth and time.
type guarded struct {
	exec.ControlStructure
	name string
	// A set's target when it is an attribute or item of a container.
	target, container nodes.Expression
}

func (c *guarded) Execute(r *exec.Renderer, tag *nodes.ControlStructureBlock) error {
	g := guardOf(r.Environment.Context)
	if g == nil {
		return errors.New("chat template: no sandbox")
	}
	if err := g.enter("control structures"); err != nil {
		return err
	}
	defer g.leave()
	if err := c.ControlStructure.Execute(r, tag); err != nil {
		return err
	}
	if c.target != nil {
		ev := r.Evaluator()
		into, value := ev.Eval(c.container), ev.Eval(c.target)
		if !into.IsError() && !value.IsError() && reaches(value.Val, into.Val, 1<<20) {
			return g.fail("%s holds itself (printing it would never end)", c.container)
		}
	}
	return g.check()
}

// reaches reports whether the map or slice target is reachable from v
// (looking at no more than budget values: past it, it answers true).
func reaches(v, target reflect.Value, budget int) bool {
	for target.Kind() == reflect.Interface || target.Kind() == reflect.Pointer {
		if target.IsNil() {
			return false
		}
		target = target.Elem()
	}
	if target.Kind() != reflect.Map && target.Kind() != reflect.Slice {
		return false
	}
	want := target.Pointer()
	seen := map[uintptr]bool{}
	valueType := reflect.TypeFor[*exec.Value]()
	var walk func(v reflect.Value) bool
	walk = func(v reflect.Value) bool {
		if budget--; budget < 0 {
			return true
		}
		if !v.IsValid() {
			return false
		}
		if v.Type() == valueType && v.CanInterface() {
			if v.IsNil() {
				return false
			}
			return walk(v.Interface().(*exec.Value).Val)
		}
		switch v.Kind() {
		case reflect.Struct: // exec.Dict, exec.Pair, …
			for i := range v.NumField() {
				if walk(v.Field(i)) {
					return true
				}
			}
		case reflect.Interface:
			return !v.IsNil() && walk(v.Elem())
		case reflect.Pointer:
			if v.IsNil() {
				return false
			}
			if p := v.Pointer(); seen[p] {
				return false
			} else {
				seen[p] = true
			}
			return walk(v.Elem())
		case reflect.Map:
			p := v.Pointer()
			if p == want {
				return true
			}
			if seen[p] {
				return false
			}
			seen[p] = true
			for it := v.MapRange(); it.Next(); {
				if walk(it.Value()) {
					return true
				}
			}
		case reflect.Slice:
			if v.Len() > 0 {
				p := v.Pointer()
				if p == want {
					return true
				}
				if seen[p] {
					return false
				}
				seen[p] = true
			}
			for i := range v.Len() {
				if walk(v.Index(i)) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// guardedMacro defines a macro whose calls count in the guard's depth and
// whose output is bounded.
type guardedMacro struct {
	exec.ControlStructure
	name string
}

func (c *guardedMacro) Execute(r *exec.Renderer, tag *nodes.ControlStructureBlock) error {
	g := guardOf(r.Environment.Context)
	if g == nil {
		return errors.New("chat template: no sandbox")
	}
	if err := c.ControlStructure.Execute(r, tag); err != nil {
		return err
	}
	v, ok := r.Environment.Context.Get(c.name)
	m, isMacro := v.(exec.Macro)
	if !ok || !isMacro {
		return fmt.Errorf("chat template: macro %q was not defined", c.name)
	}
	name := c.name
	r.Environment.Context.Set(name, exec.Macro(func(params *exec.VarArgs) *exec.Value {
		if err := g.enter("macro calls"); err != nil {
			return exec.AsValue(err)
		}
		defer g.leave()
		for _, a := range params.Args {
			if err := g.checkString("an argument of macro "+name, a); err != nil {
				return exec.AsValue(err)
			}
		}
		for _, a := range params.KwArgs {
			if err := g.checkString("an argument of macro "+name, a); err != nil {
				return exec.AsValue(err)
			}
		}
		out := m(params)
		if err := g.checkString("macro "+name, out); err != nil {
			return exec.AsValue(err)
		}
		if err := g.check(); err != nil {
			return exec.AsValue(err)
		}
		return out
	}))
	return nil
}

// mulFilter is the "*" operator, rewritten into a filter at compile time
// (rewriteMultiply): gonja's repeats a string any number of times in one
// allocation ('x' * 10**10); this one refuses a product longer than
// MaxOutput, and is otherwise gonja's operator.
const mulFilter = "__glmflash_mul"

func multiply(g *guard, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if len(params.Args) != 1 {
		return exec.AsValue(errors.New("*: one right operand"))
	}
	right := params.Args[0]
	switch {
	case in.IsFloat() || right.IsFloat():
		return exec.AsValue(in.Float() * right.Float())
	case in.IsString():
		n := max(right.Integer(), 0)
		if s := in.String(); n > 0 && len(s) > g.lim.MaxOutput/n {
			return exec.AsValue(g.fail("a string of %d bytes repeated %d times is more than %d bytes", len(s), n, g.lim.MaxOutput))
		}
		return exec.AsValue(strings.Repeat(in.String(), n))
	}
	return exec.AsValue(in.Integer() * right.Integer())
}

// rewriteMultiply replaces every a * b of a parsed template with
// a | __glmflash_mul(b), wherever it is in the tree (control structures
// keep their expressions in unexported fields: they are reached through
// unsafe, read and written in place before the template is ever run).
func rewriteMultiply(root *nodes.Template) {
	seen := map[uintptr]bool{}
	exprType := reflect.TypeFor[nodes.Expression]()
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Interface:
			if v.IsNil() {
				return
			}
			if b, ok := v.Elem().Interface().(*nodes.BinaryExpression); ok && b.Operator != nil && b.Operator.Token != nil && b.Operator.Token.Val == "*" && v.Type() == exprType && v.CanSet() {
				walk(reflect.ValueOf(b).Elem())
				v.Set(reflect.ValueOf(&nodes.FilteredExpression{Expression: b.Left, Filters: []*nodes.FilterCall{{Token: b.Operator.Token, Name: mulFilter, Args: []nodes.Expression{b.Right}}}}))
				return
			}
			walk(v.Elem())
		case reflect.Pointer:
			if v.IsNil() || seen[v.Pointer()] {
				return
			}
			seen[v.Pointer()] = true
			walk(v.Elem())
		case reflect.Struct:
			for i := range v.NumField() {
				f := v.Field(i)
				if !f.CanSet() && f.CanAddr() {
					f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
				}
				walk(f)
			}
		case reflect.Slice, reflect.Array:
			for i := range v.Len() {
				walk(v.Index(i))
			}
		case reflect.Map:
			for it := v.MapRange(); it.Next(); {
				e := reflect.New(it.Value().Type()).Elem()
				e.Set(it.Value())
				walk(e)
				v.SetMapIndex(it.Key(), e)
			}
		}
	}
	walk(reflect.ValueOf(root))
}
