package access

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func guarded(g *Guard) (http.Handler, *bool) {
	reached := new(bool)
	return g.HTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { *reached = true }), func(w http.ResponseWriter, r *Refusal) {
		http.Error(w, r.Msg, r.Status)
	}), reached
}

func TestGuardHostsAndOrigins(t *testing.T) {
	require.Equal(t, LoopbackHosts, DefaultHosts("127.0.0.1:8000"))
	require.Equal(t, LoopbackHosts, DefaultHosts("[::1]:8000"))
	require.Equal(t, LoopbackHosts, DefaultHosts("localhost:8000"))
	require.Equal(t, []string{"*"}, DefaultHosts("0.0.0.0:8000"))
	require.Equal(t, []string{"*"}, DefaultHosts(":8000"))
	h, reached := guarded(&Guard{Hosts: LoopbackHosts})
	for host, want := range map[string]int{"127.0.0.1:8000": 200, "localhost": 200, "LOCALHOST.:80": 200, "[::1]:1": 200, "a.localhost": 200,
		"evil.example": 421, "127.0.0.1.evil.example": 421, "localhost.evil.example": 421, "": 421, "evillocalhost": 421} {
		*reached = false
		r := httptest.NewRequest("POST", "/v1/completions", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, want, w.Code, host)
		require.Equal(t, want == 200, *reached, host)
	}
	h, reached = guarded(&Guard{Hosts: []string{"*"}, Origins: []string{"https://app.example"}})
	for origin, want := range map[string]int{"": 200, "https://app.example": 200, "http://127.0.0.1:8000": 200 /* same origin */, "https://evil.example": 403, "null": 403} {
		*reached = false
		r := httptest.NewRequest("POST", "http://127.0.0.1:8000/v1/completions", nil)
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, want, w.Code, origin)
		require.Equal(t, want == 200, *reached, origin)
		if origin == "https://app.example" {
			require.Equal(t, origin, w.Header().Get("Access-Control-Allow-Origin"))
		} else {
			require.Empty(t, w.Header().Get("Access-Control-Allow-Origin"), origin)
		}
	}
	for _, bad := range []string{"", "http://x", "x:80", "a.*.b", "x/y"} {
		require.Error(t, CheckHostPattern(bad), bad)
	}
	for _, good := range []string{"*", "api.example", "*.example", "10.0.0.5", "::1"} {
		require.NoError(t, CheckHostPattern(good), good)
	}
	for _, bad := range []string{"app.example", "ftp://x", "https://x/path", "https://u@x", "https://x?q"} {
		require.Error(t, CheckOrigin(bad), bad)
	}
}

// No Host or Origin makes the guard panic, and a loopback guard never lets
// a foreign name through.
func FuzzGuard(f *testing.F) {
	for _, s := range []string{"127.0.0.1:8000", "evil.example", "[::1]", "a.localhost", "localhost.", "", "[", "%", "http://x"} {
		f.Add(s, "https://evil.example")
	}
	f.Fuzz(func(t *testing.T, host, origin string) {
		h, reached := guarded(&Guard{Hosts: LoopbackHosts})
		r := httptest.NewRequest("GET", "/health", nil)
		r.Host = host
		r.Header.Set("Origin", origin)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if *reached {
			hn := hostOnly(host)
			if hn != "localhost" && !strings.HasSuffix(hn, ".localhost") && hn != "127.0.0.1" && hn != "::1" {
				t.Fatalf("host %q (%q) let through", host, hn)
			}
		} else if w.Code != 421 && w.Code != 403 {
			t.Fatalf("refused with %d", w.Code)
		}
	})
}
