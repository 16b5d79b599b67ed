package argsgen

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
)

// A Variant is a family of kernels whose name the backend composes at run
// time (a precision, a width, a size class): Generate writes a function
// Func taking one parameter per axis of Pattern and returning the kernel
// those values name, so the composition is checked when the file is
// generated (every combination must be a kernel, all of one argument
// struct) instead of when the GPU looks the name up.
//
// Pattern is the kernel name with axes {name:kind=v1|v2|…}: kind int or
// string (the function then also returns ok, false for values not
// listed) or bool (two values: false's, then true's; a function of bool
// axes only returns just the kernel).
type Variant struct {
	Func, Doc, Pattern string
}

// Variants are the composed kernel names of kernels/cuda and the CUDA
// backend.
var Variants = []Variant{
	{"GemvSIMTKernel", "is glmf_gemv's kernel for a precision (d: double sums, f: float sums) and rows a pass", "glmf_gemv_{prec:string=d|f}{rows:int=1|2|4|8}"},
	{"GemvMMAKernel", "is the tensor-core GEMV for a weight type and a tile shape", "glmf_gemv_mma_{w:string=f8|b16}_{shape:string=t1|t2|dual|t1k}"},
	{"KDARecurrentRegKernel", "is the register-resident KDA recurrence for head dimension dh", "glmf_kda_recurrent_reg{dh:int=8|16|32|64|128}"},
	{"MLAQabsKernel", "is the MLA query absorption, small: the small-tile variant (few rows)", "glmf_mla_qabs{small:bool=|_s}"},
	{"MLALogitsKernel", "is the MLA logits, small: the small-tile variant (few rows)", "glmf_mla_logits{small:bool=|_s}"},
	{"MLAAccumKernel", "is the MLA accumulation, small: the small-tile variant (few rows)", "glmf_mla_accum{small:bool=|_s}"},
	{"MLAExpandKernel", "is the MLA value expansion, small: the small-tile variant (few rows)", "glmf_mla_expand{small:bool=|_s}"},
	{"MHCPreKernel", "is mHC's pre projection, tok: the few-token variant", "glmf_mhc_pre{tok:bool=|_tok}"},
	{"MHCPostPreKernel", "is mHC's fused post and pre projection, tok: the few-token variant", "glmf_mhc_post_pre{tok:bool=|_tok}"},
}

var axisRE = regexp.MustCompile(`\{(\w+):(int|string|bool)=([^}]*)\}`)

type axis struct {
	name, kind string
	vals       []string
}

// combo is one combination of axis values: the kernel name and the Go
// condition selecting it.
type combo struct {
	name string
	cond []string
}

func writeVariant(buf *bytes.Buffer, v Variant, ks map[string]kernel) error {
	var axes []axis
	lits := axisRE.Split(v.Pattern, -1)
	for _, m := range axisRE.FindAllStringSubmatch(v.Pattern, -1) {
		a := axis{name: m[1], kind: m[2], vals: strings.Split(m[3], "|")}
		if a.kind == "bool" && len(a.vals) != 2 {
			return fmt.Errorf("variant %s: bool axis %s needs two values", v.Func, a.name)
		}
		axes = append(axes, a)
	}
	combos := []combo{{name: lits[0]}}
	for i, a := range axes {
		var next []combo
		for _, c := range combos {
			for j, val := range a.vals {
				var cond string
				switch a.kind {
				case "bool":
					cond = a.name
					if j == 0 {
						cond = "!" + a.name
					}
				case "int":
					cond = a.name + " == " + val
				default:
					cond = fmt.Sprintf("%s == %q", a.name, val)
				}
				next = append(next, combo{name: c.name + val + lits[i+1], cond: append(append([]string(nil), c.cond...), cond)})
			}
		}
		combos = next
	}
	args := ""
	onlyBool := true
	var params, doc []string
	for _, a := range axes {
		params = append(params, a.name+" "+a.kind)
		if a.kind != "bool" {
			onlyBool = false
			doc = append(doc, a.name+" "+strings.Join(a.vals, ", "))
		}
	}
	for _, c := range combos {
		k, ok := ks[c.name]
		if !ok {
			return fmt.Errorf("variant %s: %s is not a kernel of the sources", v.Func, c.name)
		}
		if args != "" && k.args != args {
			return fmt.Errorf("variant %s: %s takes %s, the others %s", v.Func, c.name, k.args, args)
		}
		args = k.args
	}
	kt := args + "Kernel"
	fmt.Fprintf(buf, "// %s %s: %s", v.Func, v.Doc, v.Pattern)
	if !onlyBool {
		fmt.Fprintf(buf, " (%s; ok false for other values)", strings.Join(doc, "; "))
	}
	buf.WriteString(".\n")
	if onlyBool {
		fmt.Fprintf(buf, "func %s(%s) %s {\n", v.Func, strings.Join(params, ", "), kt)
		for _, c := range combos[:len(combos)-1] {
			fmt.Fprintf(buf, "\tif %s {\n\t\treturn Kernel%s\n\t}\n", strings.Join(c.cond, " && "), goKernel(c.name))
		}
		fmt.Fprintf(buf, "\treturn Kernel%s\n}\n\n", goKernel(combos[len(combos)-1].name))
		return nil
	}
	fmt.Fprintf(buf, "func %s(%s) (k %s, ok bool) {\n\tswitch {\n", v.Func, strings.Join(params, ", "), kt)
	for _, c := range combos {
		fmt.Fprintf(buf, "\tcase %s:\n\t\treturn Kernel%s, true\n", strings.Join(c.cond, " && "), goKernel(c.name))
	}
	buf.WriteString("\t}\n\treturn 0, false\n}\n\n")
	return nil
}
