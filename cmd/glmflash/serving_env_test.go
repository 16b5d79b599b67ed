package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/attrib"
	"github.com/stretchr/testify/require"
)

// An arm's server runs with a clean environment: the study's GLMFLASH_
// variables do not reach it (issue 37: they overrode the arm's
// configuration), serving.env's do.
func TestArmServerEnvironment(t *testing.T) {
	bin, err := exec.LookPath("env")
	if err != nil {
		t.Skip("no env(1) to print a child's environment")
	}
	t.Setenv("GLMFLASH_RUNTIME__SLOTS", "1")
	t.Setenv("GLMFLASH_PARALLEL__ATTENTION_TP_SIZE", "2")
	t.Setenv("GLMFLASH_CUDA_EMULATOR", "1")
	t.Setenv("UNRELATED_SECRET", "s")
	r := &servingRunner{binary: bin, st: &attrib.Study{Serving: attrib.Serving{Env: map[string]string{"GLMFLASH_GEMM": "purego"}}}}
	cmd, release, err := r.command(nil)
	require.NoError(t, err)
	defer release()
	out, err := cmd.Output()
	require.NoError(t, err)
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	var glm []string
	for _, kv := range got {
		if strings.HasPrefix(kv, "GLMFLASH_") {
			glm = append(glm, kv)
		}
	}
	require.Equal(t, []string{"GLMFLASH_GEMM=purego"}, glm)
	require.NotContains(t, got, "UNRELATED_SECRET=s")
	require.Contains(t, strings.Join(got, "\n"), "PATH=")
}
