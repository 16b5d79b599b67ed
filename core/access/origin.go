package access

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Guard checks the Host and Origin headers of HTTP requests, against DNS
// rebinding (a page on evil.example whose name now resolves to 127.0.0.1
// sends Host: evil.example) and cross-origin calls from browsers. CORS is
// off unless Origins lists the origins that may call.
type Guard struct {
	// Hosts are the Host names accepted ("*": any; "*.example.com": any
	// subdomain); matched without the port, case-insensitively.
	Hosts []string
	// Origins are the browser origins ("https://app.example", "*": any)
	// that may call cross-origin; a request with another foreign Origin
	// is refused.
	Origins []string
}

// LoopbackHosts are the Host names a server bound to a loopback address
// accepts by default.
var LoopbackHosts = []string{"localhost", "*.localhost", "127.0.0.1", "::1"}

// DefaultHosts are the hosts accepted when none are configured: for a
// loopback bind address only loopback names, else any.
func DefaultHosts(bindAddr string) []string {
	host, _, err := net.SplitHostPort(bindAddr)
	if err != nil {
		host = bindAddr
	}
	if host == "localhost" {
		return LoopbackHosts
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return LoopbackHosts
	}
	return []string{"*"}
}

// CheckHostPattern validates one allowed-host entry.
func CheckHostPattern(h string) error {
	switch {
	case h == "*":
		return nil
	case h == "":
		return errors.New("empty")
	case strings.ContainsAny(h, "/:@ \t") && net.ParseIP(h) == nil:
		return fmt.Errorf("%q is not a host name (no scheme, port or path: \"api.example.com\", \"*.example.com\", \"10.0.0.5\" or \"*\")", h)
	case strings.Contains(strings.TrimPrefix(h, "*."), "*"):
		return fmt.Errorf("%q: only a leading \"*.\" wildcard is allowed", h)
	}
	return nil
}

// CheckOrigin validates one allowed-origin entry.
func CheckOrigin(o string) error {
	if o == "*" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return fmt.Errorf("%q is not an origin (scheme://host[:port], e.g. \"https://app.example\", or \"*\")", o)
	}
	return nil
}

func hostOnly(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
}

func (g *Guard) hostAllowed(hostport string) bool {
	h := hostOnly(hostport)
	if h == "" {
		return false
	}
	for _, p := range g.Hosts {
		p = strings.ToLower(p)
		switch {
		case p == "*":
			return true
		case strings.HasPrefix(p, "*."):
			if strings.HasSuffix(h, p[1:]) {
				return true
			}
		case h == p:
			return true
		}
	}
	return false
}

// sameOrigin reports whether origin names the host the request was sent
// to (a page this server served would; it serves none, but a proxy may).
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, host)
}

func (g *Guard) originAllowed(origin string) bool {
	return slices.Contains(g.Origins, "*") || slices.ContainsFunc(g.Origins, func(o string) bool {
		return strings.EqualFold(strings.TrimSuffix(o, "/"), origin)
	})
}

// Refusal is why Guard refused a request.
type Refusal struct {
	Status int // 403, or 421 for a Host that is not this server's
	Msg    string
}

func (r *Refusal) Error() string { return r.Msg }

// HTTP wraps next: a request whose Host is not allowed gets 421 (written
// by refuse), one whose Origin is foreign and not allowed 403; an allowed
// origin gets CORS headers, and its preflight (OPTIONS) is answered here.
func (g *Guard) HTTP(next http.Handler, refuse func(w http.ResponseWriter, r *Refusal)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.hostAllowed(r.Host) {
			refuse(w, &Refusal{Status: http.StatusMisdirectedRequest, Msg: fmt.Sprintf("Host %q is not served here (server.allowed_hosts)", r.Host)})
			return
		}
		origin := r.Header.Get("Origin")
		if origin == "" || sameOrigin(origin, r.Host) {
			next.ServeHTTP(w, r)
			return
		}
		if !g.originAllowed(origin) {
			refuse(w, &Refusal{Status: http.StatusForbidden, Msg: fmt.Sprintf("cross-origin requests from %q are not allowed (server.allowed_origins)", origin)})
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", origin)
		h.Add("Vary", "Origin")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "GET, POST")
			h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key")
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.Set("Access-Control-Expose-Headers", "X-Request-Id")
		next.ServeHTTP(w, r)
	})
}
