package all_test

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/glmflash/glmflash/core/pass"
	_ "github.com/glmflash/glmflash/passes/all"
	"github.com/stretchr/testify/require"
)

// Every package under passes/ (but this one) is a registered pass: its
// blank import here is the one registration line a new pass needs.
func TestEveryPassPackageIsRegistered(t *testing.T) {
	registered := map[string]string{}
	for _, name := range pass.Names() {
		r, _ := pass.Lookup(name)
		registered[filepath.Base(reflect.TypeOf(r.New()).Elem().PkgPath())] = name
	}
	ents, err := os.ReadDir("..")
	require.NoError(t, err)
	var pkgs []string
	for _, e := range ents {
		if e.IsDir() && e.Name() != "all" {
			pkgs = append(pkgs, e.Name())
			require.Contains(t, registered, e.Name(), "passes/%s is not registered: add its blank import to passes/all", e.Name())
		}
	}
	require.Len(t, registered, len(pkgs), "registered passes outside passes/: %v", registered)
}
