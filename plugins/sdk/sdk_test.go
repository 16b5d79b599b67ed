package sdk_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The SDK is a thin contract: a plugin binary links the IR, the pass
// interface, the wire format and the protocol (with gRPC and go-plugin),
// never the engine's configuration, logging or serving stack.
func TestSDKDependsOnTheContractOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, string(out))
	allowed := map[string]bool{
		"core/ir": true, "core/pass": true, "model": true, "model/safetensors": true,
		"internal/regular": true, "internal/strict": true, "internal/proctree": true,
		"plugins/wire": true, "plugins/protocol": true, "plugins/sdk": true, "proto/glmflash/plugin/v1": true,
	}
	const mod = "github.com/glmflash/glmflash/"
	var ours []string
	for _, p := range strings.Fields(string(out)) {
		for _, banned := range []string{"koanf", "zerolog", "yaml", "cobra", "prometheus", mod + "core/config"} {
			require.NotContains(t, p, banned, "the SDK must not link %s", banned)
		}
		if rest, ok := strings.CutPrefix(p, mod); ok {
			ours = append(ours, rest)
			require.True(t, allowed[rest], "the SDK depends on %s", p)
		}
	}
	require.Contains(t, ours, "core/ir")
	require.Contains(t, ours, "plugins/wire")
}
