package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"github.com/spf13/cobra"
)

const modulePath = "github.com/glmflash/glmflash"

var pluginNameRE = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`)

func newPluginCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "plugin", Short: "Write pass plugins (see the README: Write your first pass plugin)"}
	var dir, src string
	newCmd := &cobra.Command{
		Use:   "new NAME [--dir DIR]",
		Short: "Scaffold a pass plugin: a compilable skeleton of a pass served with plugins/sdk",
		Long: `Scaffold a pass plugin named NAME (lower-case words joined by dashes): DIR/NAME/main.go
holds a pass written as the built-in passes are (a pass.Description, and Eligible and
Apply of the pass.Pass interface) and serves it with sdk.Serve.

Inside a glmflash checkout (the default --dir plugins/local) the plugin is a package
of this module and builds at once:
  go build -o bin/plugins/glmflash-pass-NAME ./plugins/local/NAME
Elsewhere it is a module of its own whose go.mod points at the checkout with a
replace directive (--glmflash-src, default: the checkout around the working
directory) and starts from the checkout's requirements and go.sum, so that
  go build -mod=mod -o glmflash-pass-NAME .
works offline.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			files, err := scaffoldPlugin(args[0], dir, src)
			if err != nil {
				return err
			}
			for _, f := range files {
				fmt.Fprintln(cmd.OutOrStdout(), "wrote", f)
			}
			return nil
		},
	}
	newCmd.Flags().StringVar(&dir, "dir", "", "parent folder of the new plugin (default: plugins/local of the glmflash checkout)")
	newCmd.Flags().StringVar(&src, "glmflash-src", "", "glmflash checkout a plugin outside it builds against (default: found from the working directory)")
	cmd.AddCommand(newCmd)
	return cmd
}

// findModuleRoot walks up from dir to the glmflash checkout ("" if none).
func findModuleRoot(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if f, err := os.Open(filepath.Join(d, "go.mod")); err == nil {
			sc := bufio.NewScanner(f)
			first := ""
			for sc.Scan() {
				if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "//") {
					first = l
					break
				}
			}
			f.Close()
			if first == "module "+modulePath {
				return d
			}
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

type scaffoldData struct {
	Name, Binary, Build string
	Standalone          bool
	Src                 string
	// Requires are the checkout's module requirements (a standalone plugin
	// starts from them, with the checkout's go.sum, so that it builds offline).
	Requires []string
}

// moduleRequires returns the requirement lines of root/go.mod.
func moduleRequires(root string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	var out []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		t := strings.TrimSpace(l)
		switch {
		case t == "require (":
			in = true
		case in && t == ")":
			in = false
		case in && t != "" && !strings.HasPrefix(t, "//"):
			out = append(out, t)
		case strings.HasPrefix(t, "require ") && !strings.HasSuffix(t, "("):
			out = append(out, strings.TrimPrefix(t, "require "))
		}
	}
	return out, nil
}

// scaffoldPlugin writes the skeleton and returns the files written.
func scaffoldPlugin(name, dir, src string) ([]string, error) {
	if !pluginNameRE.MatchString(name) {
		return nil, fmt.Errorf("plugin name %q: use lower-case letters and digits in words joined by dashes (e.g. my-fusion)", name)
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	root := findModuleRoot(cwd)
	if dir == "" {
		if root == "" {
			return nil, fmt.Errorf("not inside a glmflash checkout: give --dir (and --glmflash-src)")
		}
		dir = filepath.Join(root, "plugins", "local")
	}
	abs, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(abs); err == nil {
		return nil, fmt.Errorf("%s already exists", abs)
	}
	d := scaffoldData{Name: name, Binary: "glmflash-pass-" + name}
	if r := findModuleRoot(abs); r != "" {
		if src != "" {
			return nil, fmt.Errorf("--glmflash-src is for a plugin outside a checkout; %s is inside %s", abs, r)
		}
		rel, _ := filepath.Rel(r, abs)
		d.Build = fmt.Sprintf("go build -o bin/plugins/%s ./%s   # in %s", d.Binary, filepath.ToSlash(rel), r)
	} else {
		if src == "" {
			src = root
		}
		if src == "" || findModuleRoot(src) == "" {
			return nil, fmt.Errorf("%s is outside a glmflash checkout: give --glmflash-src DIR (the checkout its go.mod replaces %s with)", abs, modulePath)
		}
		if src, err = filepath.Abs(findModuleRoot(src)); err != nil {
			return nil, err
		}
		d.Standalone, d.Src = true, src
		if d.Requires, err = moduleRequires(src); err != nil {
			return nil, err
		}
		d.Build = fmt.Sprintf("go build -mod=mod -o %s .   # in %s", d.Binary, abs)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, err
	}
	files := []struct {
		name string
		tmpl *template.Template
	}{{"main.go", mainTmpl}}
	if d.Standalone {
		files = append(files, struct {
			name string
			tmpl *template.Template
		}{"go.mod", goModTmpl})
	}
	var wrote []string
	if d.Standalone {
		sum, err := os.ReadFile(filepath.Join(d.Src, "go.sum"))
		if err != nil {
			return nil, err
		}
		p := filepath.Join(abs, "go.sum")
		if err := os.WriteFile(p, sum, 0o644); err != nil {
			return nil, err
		}
		wrote = append(wrote, p)
	}
	for _, f := range files {
		p := filepath.Join(abs, f.name)
		out, err := os.Create(p)
		if err != nil {
			return wrote, err
		}
		err = f.tmpl.Execute(out, d)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return wrote, err
		}
		wrote = append(wrote, p)
	}
	return wrote, nil
}

var goModTmpl = template.Must(template.New("go.mod").Parse(`module example.com/{{.Binary}}

go 1.26

require ` + modulePath + ` v0.0.0-00010101000000-000000000000

// the glmflash checkout's own requirements (with its go.sum: builds offline)
require (
{{range .Requires}}	{{.}}
{{end}})

replace ` + modulePath + ` => {{.Src}}
`))

var mainTmpl = template.Must(template.New("main.go").Parse(`// Command {{.Binary}} is a glmflash pass plugin: the pass {{printf "%q" .Name}}.
//
// Build it (the engine runs executables named glmflash-pass-* from plugins.dir):
//
//	{{.Build}}
//
// then put its SHA-256 in the configuration (plugins.checksums or plugins.sums_file),
// list {{.Name}} in passes:, and check what it does with
//
//	glmflash passes explain --preset tiny --config engine.yaml
package main

import (
	"fmt"
	"slices"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/plugins/sdk"
)

// Name is the pass's name in the configuration's passes: list.
const Name = {{printf "%q" .Name}}

// Description is what the pass says about itself, declared once: the
// engine shows it (its options come from the Options struct's tags).
var Description = pass.Description{Name: Name, Version: "0.1.0",
	Summary: "TODO: one line on what this pass rewrites"}

// Options are the pass's options, declared once: the engine shows and
// checks the schema these tags give (name, default, doc; enum for strings).
// Field types: bool, int, float64, string, []int, pass.Path.
type Options struct {
	Layers []int ` + "`" + `option:"layers" doc:"only these layers (empty: all)"` + "`" + `
}

// Stats are the pass's statistics (named counters shown in the report).
type Stats struct {
	Sites int ` + "`" + `stat:"sites_rewritten" doc:"TODO: what you count"` + "`" + `
}

// Pass implements pass.Pass, exactly like a built-in pass (see passes/*).
type Pass struct{ opts Options }

// Options implements pass.WithOptions: the engine decodes the configured
// options (strictly, with the defaults of the tags) into it.
func (p *Pass) Options() any { return &p.opts }

// Eligible implements pass.Pass: every candidate site, OK or skipped with a
// human reason. It must not modify the graph, and must be a pure function of
// the graph, env and options (the SDK runs it again before Apply).
//
// TODO: match the pattern your rewrite needs. This skeleton offers one site
// per MoE layer (the moe_route node) and fires nowhere harmful: Apply below
// leaves the graph as it is.
func (p *Pass) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	var sites []pass.Site
	for _, n := range g.Nodes {
		if n.Op != ir.OpMoERoute {
			continue
		}
		where := fmt.Sprintf("layer %d", n.Layer)
		switch {
		case len(p.opts.Layers) > 0 && !slices.Contains(p.opts.Layers, n.Layer):
			sites = append(sites, pass.Skip(where, n.Layer, "layer %d is not in option layers", n.Layer))
		case env.WeightDType(n.Inputs[1].Ref).String() == "F8_E4M3":
			sites = append(sites, pass.Skip(where, n.Layer, "router bias is FP8"))
		default:
			sites = append(sites, pass.Site{Where: where, Layer: n.Layer, OK: true, Nodes: []*ir.Node{n}, Data: n})
		}
	}
	return sites
}

// Apply implements pass.Pass: rewrite the OK sites. Build new nodes with
// g.NewNode, reroute readers with g.ReplaceUses, insert with g.InsertAt and
// drop what became unused with g.RemoveDead. Weights are leaves named by
// checkpoint tensor: to change them, build derived weights with the const ops
// concat_rows and stack (folded once at load). The result must verify.
func (p *Pass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	res := pass.Result{}
	var st Stats
	for _, s := range sites {
		n := s.Data.(*ir.Node)
		_ = n // TODO: rewrite around n
		res.Fired++
		st.Sites++
	}
	g.RemoveDead()
	res.Stats = pass.Counters(&st)
	return res, nil
}

func main() { sdk.Serve(Description, &Pass{}) }
`))
