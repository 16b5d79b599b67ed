package pass

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The rules of pass names, which plugins' declared names follow too.
func TestCheckName(t *testing.T) {
	for _, ok := range []string{"a", "mlp-gate-up-fusion", "x2", "dsa-pooled-metadata", strings.Repeat("a", MaxNameLength)} {
		require.NoError(t, CheckName(ok), ok)
	}
	for _, bad := range []string{"", "../x", "a/b", "A", "has space", "a--b", "-a", "a-", "1a", "a_b", "a.b", "é", strings.Repeat("a", MaxNameLength+1)} {
		require.Error(t, CheckName(bad), "%q", bad)
	}
	require.PanicsWithValue(t, `pass: pass name "Bad Name" must be lower-case words of ASCII letters and digits joined by single hyphens, starting with a letter (like mlp-gate-up-fusion)`, func() {
		Register(Description{Name: "Bad Name", Version: "1", Summary: "s", Verify: "v", Draft: "d"}, nil)
	})
}
