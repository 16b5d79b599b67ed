package argsgen

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func writeSrc(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for n, s := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(s), 0o644))
	}
	return dir
}

// Kernels are found through KERNEL, KERNEL_BOUNDS and macros wrapping them
// with a fixed struct; each gets a constant of its struct's kernel type
// and a launcher, defined twice (#if branches) it counts once.
func TestGenerateLaunchers(t *testing.T) {
	dir := writeSrc(t, map[string]string{"a.cu": `
struct AArgs { float* x; i64 n; };
struct BArgs { double s; };
#define W_KERNEL(name, minb) KERNEL_BOUNDS(name, AArgs, 256, minb)
KERNEL(glmf_a_one, AArgs) { }
#ifdef GLMF_EMU
KERNEL(glmf_b, BArgs) { }
#else
KERNEL_BOUNDS(glmf_b, BArgs, 128, 2) { }
#endif
W_KERNEL(glmf_a_two, 4) { }
// KERNEL(glmf_commented, AArgs)
`})
	src, err := GenerateWith(dir, "p", nil)
	require.NoError(t, err)
	s := string(src)
	for _, want := range []string{
		"type AArgsKernel uint16", "type BArgsKernel uint16",
		"_ AArgsKernel = iota\n\t// KernelAOne is glmf_a_one (src/a.cu).\n\tKernelAOne\n\t// KernelATwo is glmf_a_two (src/a.cu).\n\tKernelATwo\n",
		"_ BArgsKernel = iota\n\t// KernelB is glmf_b (src/a.cu).\n\tKernelB\n",
		"func LaunchAOne(d *Device, grid, block Dim3, smem int, a *AArgs) error",
		"func LaunchB(d *Device, grid, block Dim3, smem int, a *BArgs) error",
		`"glmf_a_one",`, `"glmf_a_two",`, `"glmf_b",`,
	} {
		require.Contains(t, s, want)
	}
	require.NotContains(t, s, "glmf_commented")
	require.Equal(t, 1, strings.Count(s, "func LaunchB("))
}

// A kernel of an unmirrored struct, or defined with two structs, fails.
func TestGenerateKernelErrors(t *testing.T) {
	_, err := GenerateWith(writeSrc(t, map[string]string{"a.cu": "KERNEL(glmf_x, Unknown) { }\n"}), "p", nil)
	require.ErrorContains(t, err, "not a mirrored struct")
	_, err = GenerateWith(writeSrc(t, map[string]string{"a.cu": "struct A { i64 n; };\nstruct B { i64 n; };\nKERNEL(glmf_x, A) { }\n", "b.cu": "KERNEL(glmf_x, B) { }\n"}), "p", nil)
	require.ErrorContains(t, err, "takes B here and A")
}

// A variant table names existing kernels of one struct, or fails.
func TestWriteVariant(t *testing.T) {
	ks := map[string]kernel{"glmf_v_a1": {"glmf_v_a1", "A", "a.cu"}, "glmf_v_a2": {"glmf_v_a2", "A", "a.cu"}, "glmf_v_b1": {"glmf_v_b1", "A", "a.cu"},
		"glmf_s": {"glmf_s", "S", "a.cu"}, "glmf_s_x": {"glmf_s_x", "S", "a.cu"}}
	var buf bytes.Buffer
	require.NoError(t, writeVariant(&buf, Variant{"VKernel", "is v", "glmf_v_{p:string=a|b}{n:int=1}"}, ks))
	require.ErrorContains(t, writeVariant(&buf, Variant{"VKernel", "is v", "glmf_v_{p:string=a|b}{n:int=1|2}"}, ks), "glmf_v_b2 is not a kernel")
	require.NoError(t, writeVariant(&buf, Variant{"SKernel", "is s", "glmf_s{x:bool=|_x}"}, ks))
	require.Contains(t, buf.String(), "func VKernel(p string, n int) (k AKernel, ok bool)")
	require.Contains(t, buf.String(), "func SKernel(x bool) SKernel {")
	ks["glmf_s_x"] = kernel{"glmf_s_x", "T", "a.cu"}
	require.ErrorContains(t, writeVariant(&buf, Variant{"SKernel", "is s", "glmf_s{x:bool=|_x}"}, ks), "takes T, the others S")
	require.ErrorContains(t, writeVariant(&buf, Variant{"B", "", "glmf_s{x:bool=|_x|_y}"}, ks), "needs two values")
}
