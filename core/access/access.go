// Package access is who may talk to a glmflash server: TLS (and mutual
// TLS) settings that build a *tls.Config, and API keys checked against an
// "Authorization: Bearer KEY" header (or "x-api-key: KEY"). It knows
// nothing of gRPC or HTTP beyond that header, so both servers use it: the
// gRPC server through its interceptors, an HTTP server through Keys.HTTP.
package access

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/glmflash/glmflash/internal/regular"
)

// TLS configures transport security. Empty: plaintext. CertFile and
// KeyFile (PEM) serve TLS; ClientCAFile (PEM) also requires every client
// to present a certificate signed by one of its CAs (mutual TLS).
type TLS struct {
	CertFile     string `koanf:"cert_file" path:""`
	KeyFile      string `koanf:"key_file" path:""`
	ClientCAFile string `koanf:"client_ca_file" path:""`
}

// Enabled reports whether TLS is configured.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" }

// Validate checks that the fields make sense together (prefix names the
// section in errors, e.g. "server.tls").
func (t TLS) Validate(prefix string) error {
	if !t.Enabled() {
		return nil
	}
	if t.CertFile == "" || t.KeyFile == "" {
		return fmt.Errorf("%s: cert_file and key_file are both required for TLS", prefix)
	}
	return nil
}

// ServerConfig loads the certificates and returns the server's TLS
// configuration (TLS 1.2 or later), nil when TLS is not configured.
func (t TLS) ServerConfig(prefix string) (*tls.Config, error) {
	if err := t.Validate(prefix); err != nil || !t.Enabled() {
		return nil, err
	}
	certPEM, err := regular.ReadFile(t.CertFile, regular.ConfigLimit)
	if err != nil {
		return nil, fmt.Errorf("%s.cert_file: %w", prefix, err)
	}
	keyPEM, err := regular.ReadFile(t.KeyFile, regular.ConfigLimit)
	if err != nil {
		return nil, fmt.Errorf("%s.key_file: %w", prefix, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: cert_file and key_file: %w", prefix, err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCAFile != "" {
		caPEM, err := regular.ReadFile(t.ClientCAFile, regular.ConfigLimit)
		if err != nil {
			return nil, fmt.Errorf("%s.client_ca_file: %w", prefix, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("%s.client_ca_file: %s holds no PEM certificate", prefix, t.ClientCAFile)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// Auth configures API keys: files with one key per line (blank lines and
// lines starting with # are ignored). Empty APIKeysFile: no key is needed.
// Keys of AdminKeysFile may also abort any caller's request (a key listed
// in both files is an admin).
type Auth struct {
	APIKeysFile   string `koanf:"api_keys_file" path:""`
	AdminKeysFile string `koanf:"admin_keys_file" path:""`
}

// Principal is an authenticated caller.
type Principal struct {
	// ID names the key without revealing it (the first 12 hex digits of
	// its SHA-256); "" for the anonymous caller of a server without keys.
	ID    string
	Admin bool
}

// Keys checks callers. The zero (or nil) Keys lets everyone in anonymously.
type Keys struct {
	keys []key
}

type key struct {
	sum   [32]byte
	admin bool
}

// Errors of Check.
var (
	ErrMissing = errors.New("an API key is required (Authorization: Bearer KEY)")
	ErrInvalid = errors.New("invalid API key")
)

// MinKeyLength bounds how short a key may be.
const MinKeyLength = 16

// Load reads the key files (prefix names the section in errors).
func (a Auth) Load(prefix string) (*Keys, error) {
	if a.APIKeysFile == "" && a.AdminKeysFile != "" {
		return nil, fmt.Errorf("%s.admin_keys_file needs %s.api_keys_file (without it no key is checked)", prefix, prefix)
	}
	k := &Keys{}
	for _, f := range []struct {
		path, field string
		admin       bool
	}{{a.APIKeysFile, "api_keys_file", false}, {a.AdminKeysFile, "admin_keys_file", true}} {
		if f.path == "" {
			continue
		}
		b, err := regular.ReadFile(f.path, regular.ConfigLimit)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", prefix, f.field, err)
		}
		keys, err := parseKeys(b, f.path, f.admin)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", prefix, f.field, err)
		}
		k.keys = mergeKeys(k.keys, keys)
	}
	return k, nil
}

// mergeKeys adds keys to have, one entry per key: a key listed in both
// files (or twice) keeps the stronger right, admin. Listing an admin key in
// api_keys_file too is the natural way to say that it may call at all, so
// it is not refused; it used to lose its admin right (the first match won).
func mergeKeys(have, keys []key) []key {
	for _, nk := range keys {
		i := slices.IndexFunc(have, func(k key) bool { return k.sum == nk.sum })
		if i < 0 {
			have = append(have, nk)
			continue
		}
		have[i].admin = have[i].admin || nk.admin
	}
	return have
}

// parseKeys reads a key file: one key per line, # comments.
func parseKeys(b []byte, source string, admin bool) ([]key, error) {
	var out []key
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < MinKeyLength || strings.ContainsAny(line, " \t") {
			return nil, fmt.Errorf("%s:%d: a key must be at least %d characters without spaces", source, i+1, MinKeyLength)
		}
		out = append(out, key{sum: sha256.Sum256([]byte(line)), admin: admin})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no key", source)
	}
	return out, nil
}

// Required reports whether callers must present a key.
func (k *Keys) Required() bool { return k != nil && len(k.keys) > 0 }

// Check authenticates the value of an Authorization header ("Bearer KEY")
// or of an x-api-key header (the bare key). Every key is compared in
// constant time.
func (k *Keys) Check(header string) (Principal, error) {
	if !k.Required() {
		return Principal{}, nil
	}
	h := strings.TrimSpace(header)
	if h == "" {
		return Principal{}, ErrMissing
	}
	if scheme, rest, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "bearer") {
		h = strings.TrimSpace(rest)
	}
	sum := sha256.Sum256([]byte(h))
	found := -1
	for i, kk := range k.keys {
		if subtle.ConstantTimeCompare(sum[:], kk.sum[:]) == 1 && found < 0 {
			found = i
		}
	}
	if found < 0 {
		return Principal{}, ErrInvalid
	}
	return Principal{ID: hex.EncodeToString(sum[:6]), Admin: k.keys[found].admin}, nil
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the caller WithPrincipal stored (anonymous if none).
func FromContext(ctx context.Context) Principal {
	p, _ := ctx.Value(principalKey{}).(Principal)
	return p
}

// CheckHeaders checks the key a request carries: the Authorization header
// ("Bearer KEY"), else X-Api-Key; get reads a header by name (HTTP's
// Header.Get, or gRPC metadata).
func (k *Keys) CheckHeaders(get func(name string) string) (Principal, error) {
	h := get("authorization")
	if h == "" {
		h = get("x-api-key")
	}
	return k.Check(h)
}

// HTTP wraps an HTTP handler with the key check: 401 without a valid key;
// the handler finds the caller with FromContext.
func (k *Keys) HTTP(next http.Handler) http.Handler { return k.HTTPRefusing(next, nil) }

// HTTPRefusing is HTTP with the refusal written by refuse (an API's own
// error body, with status 401); nil refuse writes the error as plain text.
func (k *Keys) HTTPRefusing(next http.Handler, refuse func(w http.ResponseWriter, err error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := k.CheckHeaders(r.Header.Get)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="glmflash"`)
			if refuse != nil {
				refuse(w, err)
			} else {
				http.Error(w, err.Error(), http.StatusUnauthorized)
			}
			return
		}
		next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
	})
}

// ScopedID is the id a request of caller owner is known by inside the
// server: a client-chosen id is the caller's own, so that two keys' ids
// never collide (one key learns nothing of another's requests by picking
// the same id). Owner ids are hex, so owner+"/"+id is unambiguous.
func ScopedID(owner, id string) string {
	if owner == "" {
		return id
	}
	return owner + "/" + id
}

// ClientID is the id the caller gave (or was given) for a ScopedID.
func ClientID(owner, scoped string) string {
	return strings.TrimPrefix(scoped, owner+"/")
}
