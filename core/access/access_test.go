package access

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/internal/testcert"
	"github.com/stretchr/testify/require"
)

func TestTLSConfig(t *testing.T) {
	d := t.TempDir()
	f := testcert.Write(d)
	c, err := TLS{}.ServerConfig("server.tls")
	require.NoError(t, err)
	require.Nil(t, c, "no TLS configured: plaintext")
	_, err = TLS{CertFile: f.ServerCert}.ServerConfig("server.tls")
	require.ErrorContains(t, err, "server.tls: cert_file and key_file are both required")
	_, err = TLS{CertFile: f.ServerCert, KeyFile: f.ClientKey}.ServerConfig("server.tls")
	require.ErrorContains(t, err, "server.tls: cert_file and key_file")
	_, err = TLS{CertFile: f.ServerCert, KeyFile: filepath.Join(d, "none")}.ServerConfig("server.tls")
	require.ErrorContains(t, err, "server.tls.key_file")
	c, err = TLS{CertFile: f.ServerCert, KeyFile: f.ServerKey}.ServerConfig("server.tls")
	require.NoError(t, err)
	require.Equal(t, tls.NoClientCert, c.ClientAuth)
	require.Equal(t, uint16(tls.VersionTLS12), c.MinVersion)
	c, err = TLS{CertFile: f.ServerCert, KeyFile: f.ServerKey, ClientCAFile: f.CA}.ServerConfig("server.tls")
	require.NoError(t, err)
	require.Equal(t, tls.RequireAndVerifyClientCert, c.ClientAuth)
	_, err = TLS{CertFile: f.ServerCert, KeyFile: f.ServerKey, ClientCAFile: f.ServerKey}.ServerConfig("server.tls")
	require.ErrorContains(t, err, "server.tls.client_ca_file")
}

func writeKeys(t *testing.T, name string, lines string) string {
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(lines), 0o600))
	return p
}

func TestKeys(t *testing.T) {
	var none *Keys
	p, err := none.Check("")
	require.NoError(t, err)
	require.Equal(t, Principal{}, p, "no keys configured: anonymous")

	users := writeKeys(t, "keys", "# users\nuser-key-aaaaaaaaaa\n\nuser-key-bbbbbbbbbb\n")
	admins := writeKeys(t, "admins", "admin-key-cccccccccc\n")
	k, err := Auth{APIKeysFile: users, AdminKeysFile: admins}.Load("server.auth")
	require.NoError(t, err)
	_, err = k.Check("")
	require.ErrorIs(t, err, ErrMissing)
	_, err = k.Check("Bearer nope-nope-nope-nope")
	require.ErrorIs(t, err, ErrInvalid)
	a, err := k.Check("Bearer user-key-aaaaaaaaaa")
	require.NoError(t, err)
	b, err := k.Check("user-key-bbbbbbbbbb") // x-api-key style
	require.NoError(t, err)
	require.NotEqual(t, a.ID, b.ID)
	require.Len(t, a.ID, 12)
	require.False(t, a.Admin)
	ad, err := k.Check("bearer admin-key-cccccccccc")
	require.NoError(t, err)
	require.True(t, ad.Admin)

	// a key in both files keeps its admin right, whichever file lists it
	// first (issue 37: the api_keys_file entry won and the key lost it)
	both := writeKeys(t, "both", "admin-key-cccccccccc\nuser-key-aaaaaaaaaa\n")
	kb, err := Auth{APIKeysFile: both, AdminKeysFile: admins}.Load("server.auth")
	require.NoError(t, err)
	ad2, err := kb.Check("Bearer admin-key-cccccccccc")
	require.NoError(t, err)
	require.True(t, ad2.Admin, "a key listed in both key files is an admin")
	require.Equal(t, ad.ID, ad2.ID)
	u, err := kb.Check("Bearer user-key-aaaaaaaaaa")
	require.NoError(t, err)
	require.False(t, u.Admin)

	_, err = Auth{APIKeysFile: writeKeys(t, "short", "abc\n")}.Load("server.auth")
	require.ErrorContains(t, err, "server.auth.api_keys_file")
	_, err = Auth{APIKeysFile: writeKeys(t, "empty", "# nothing\n")}.Load("server.auth")
	require.ErrorContains(t, err, "holds no key")
	_, err = Auth{AdminKeysFile: admins}.Load("server.auth")
	require.ErrorContains(t, err, "needs server.auth.api_keys_file")
}

func TestHTTPMiddleware(t *testing.T) {
	k, err := Auth{APIKeysFile: writeKeys(t, "keys", "user-key-aaaaaaaaaa\n")}.Load("auth")
	require.NoError(t, err)
	h := k.HTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(FromContext(r.Context()).ID))
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("Authorization", "Bearer user-key-aaaaaaaaaa")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Len(t, rec.Body.String(), 12)
}

// Key files come from operators: parsing never panics, and every key it
// accepts authenticates.
func FuzzParseKeys(f *testing.F) {
	f.Add([]byte("# keys\nuser-key-aaaaaaaaaa\n\n"))
	f.Add([]byte("short\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := parseKeys(b, "keys.txt", false)
		if err != nil {
			require.Contains(t, err.Error(), "keys.txt")
			return
		}
		k := &Keys{keys: keys}
		for _, line := range strings.Split(string(b), "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				_, err := k.Check("Bearer " + l)
				require.NoError(t, err)
			}
		}
	})
}
