package attrib

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Names become file names and rows of report.md: a study named "../x"
// (which wrote outside out/studies) and workload or arm names with
// Markdown or path characters are refused, naming the field (issue 37).
func TestStudyNamesAreSafe(t *testing.T) {
	for repl, want := range map[[2]string]string{
		{"name: t", "name: ../../escape"}:                      `name: "../../escape" must be ASCII letters, digits and . _ + -`,
		{"name: t", "name: a/b"}:                               `name: "a/b"`,
		{"name: t", "name: .hidden"}:                           `name: ".hidden"`,
		{"name: t", "name: " + strings.Repeat("n", 65)}:        "name: 65 bytes, more than 64",
		{"{name: w,", `{name: "w | x",`}:                       `workloads[0].name: "w | x"`,
		{"{name: w,", "{name: '`w`',"}:                         "workloads[0].name: \"`w`\"",
		{"{name: w,", `{name: "[w](http://x)",`}:               `workloads[0].name: "[w](http://x)"`,
		{"add_one_in: true}", "explicit: [{name: 'a|b'}]}"}:    `arms.explicit[0].name: "a|b"`,
		{"add_one_in: true}", "explicit: [{name: '../arm'}]}"}: `arms.explicit[0].name: "../arm"`,
	} {
		src := strings.Replace(good, repl[0], repl[1], 1)
		require.NotEqual(t, good, src, repl)
		_, err := Parse([]byte(src), "s.yaml", known)
		require.ErrorContains(t, err, "s.yaml: "+want, repl)
	}
	for _, ok := range []string{"campaign-h200", "quick", "v1.2_test+x"} {
		_, err := Parse([]byte(strings.Replace(good, "name: t", "name: "+ok, 1)), "s.yaml", known)
		require.NoError(t, err, ok)
	}
}

// Two studies given one output directory: the second is refused at once,
// before it measures anything (issue 37: both ran and the second one's
// results were discarded by the rename at the end); after the first one
// ends the directory is free again (or holds its results).
func TestOneStudyPerOutputDirectory(t *testing.T) {
	d := t.TempDir()
	out := filepath.Join(d, "out")
	first, err := PrepareOutput(out)
	require.NoError(t, err)
	_, err = PrepareOutput(out)
	require.ErrorContains(t, err, "output directory "+out+" is being written by another study (it holds "+filepath.Join(d, ".out.lock")+")")
	_, err = PrepareOutput(out + "/")
	require.ErrorContains(t, err, "being written by another study", "the same directory, spelled otherwise")
	first.Abort()
	second, err := PrepareOutput(out)
	require.NoError(t, err, "free after the first one aborted")

	s, err := Parse([]byte(good), "s.yaml", known)
	require.NoError(t, err)
	res, err := Run(context.Background(), s, Options{Runner: &fakeRunner{}, Vocab: 50})
	require.NoError(t, err)
	_, _, err = second.Commit(res)
	require.NoError(t, err)
	second.Abort() // after a commit: harmless
	require.FileExists(t, filepath.Join(out, "report.md"))
	_, err = PrepareOutput(out)
	require.ErrorContains(t, err, "already holds", "its results are kept, not mixed")
	ents, err := os.ReadDir(d)
	require.NoError(t, err)
	require.Len(t, ents, 1, "no lock or staging folder left")
}

// An arm's server gets the system's variables and serving.env, never the
// study's GLMFLASH_ variables (issue 37: GLMFLASH_RUNTIME__SLOTS of the
// study's shell overrode every arm's configuration).
func TestArmEnvironmentIsClean(t *testing.T) {
	src := strings.Replace(good, "warmup: 1\n", "warmup: 1\nlevel: serving\nserving:\n  env: {GLMFLASH_GEMM: purego, EXTRA: 'x=y', PATH: /arm/bin}\n", 1)
	s, err := Parse([]byte(src), "s.yaml", known)
	require.NoError(t, err)
	env := s.ArmEnv([]string{"PATH=/usr/bin", "HOME=/h", "LC_ALL=C", "CUDA_VISIBLE_DEVICES=1", "GOMAXPROCS=4",
		"GLMFLASH_RUNTIME__SLOTS=1", "GLMFLASH_DEVICE=cuda", "GLMFLASH_CUDA_EMULATOR=1", "GLMFLASH_GEMM=avx2", "AWS_SECRET_ACCESS_KEY=s", "SSH_AUTH_SOCK=/s", "noequals"})
	require.Equal(t, []string{"CUDA_VISIBLE_DEVICES=1", "EXTRA=x=y", "GLMFLASH_GEMM=purego", "GOMAXPROCS=4", "HOME=/h", "LC_ALL=C", "PATH=/arm/bin"}, env)

	for envYAML, want := range map[string]string{
		"{GLMFLASH_RUNTIME__SLOTS: '2'}": "serving.env.GLMFLASH_RUNTIME__SLOTS: sets the configuration key runtime.slots, which the study decides",
		"{GLMFLASH_DEVICE: cuda}":        "serving.env.GLMFLASH_DEVICE: sets the configuration key device",
		"{'A-B': x}":                     `serving.env.A-B: "A-B" is not a variable name`,
		"{'1X': x}":                      `serving.env.1X: "1X" is not a variable name`,
	} {
		src := strings.Replace(good, "warmup: 1\n", "warmup: 1\nlevel: serving\nserving:\n  env: "+envYAML+"\n", 1)
		_, err := Parse([]byte(src), "s.yaml", known)
		require.ErrorContains(t, err, "s.yaml: "+want, envYAML)
	}
	_, err = Parse([]byte(good+"serving: {env: {X: y}}\n"), "s.yaml", known)
	require.ErrorContains(t, err, "serving.env: only for level: serving")
}
