// Package netlimit bounds the connections a listener holds: in total and
// per client (the remote IP). A connection over a bound is closed at once,
// before any byte is read, so a flood of connections cannot take the
// process's file descriptors; an HTTP server that reports its connections'
// states (http.Server.ConnState) lets the limiter close the oldest
// connection that is not serving a request (idle keep-alive, or accepted
// and silent) to make room instead, so a flood of idle connections cannot
// keep a real client (or a health check) out.
package netlimit

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Limiter counts the connections of the listeners it wraps.
type Limiter struct {
	total, perClient int

	mu       sync.Mutex
	conns    map[*conn]struct{}
	byClient map[string]int
	refused  atomic.Int64
	evicted  atomic.Int64
}

// New returns a limiter of at most total connections, at most perClient of
// them from one remote IP (0: no bound of that kind).
func New(total, perClient int) *Limiter {
	return &Limiter{total: total, perClient: perClient, conns: map[*conn]struct{}{}, byClient: map[string]int{}}
}

// Refused counts connections closed at accept for lack of room.
func (l *Limiter) Refused() int64 { return l.refused.Load() }

// Evicted counts idle connections closed to make room for a new one.
func (l *Limiter) Evicted() int64 { return l.evicted.Load() }

// Open is the number of connections held now.
func (l *Limiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// Listener wraps inner: its connections count against the limiter.
func (l *Limiter) Listener(inner net.Listener) net.Listener {
	return &listener{Listener: inner, l: l}
}

type listener struct {
	net.Listener
	l *Limiter
}

func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if w := ln.l.admit(c); w != nil {
			return w, nil
		}
		ln.l.refused.Add(1)
		c.Close()
	}
}

// conn is an admitted connection.
type conn struct {
	net.Conn
	l      *Limiter
	client string
	once   sync.Once
	// busy: serving a request (http.StateActive, or a server that reports
	// no states); since: when the state last changed.
	busy  bool
	since time.Time
}

// NetConn is the accepted connection.
func (c *conn) NetConn() net.Conn { return c.Conn }

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

func clientOf(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// admit returns the wrapped connection, or nil when there is no room even
// after closing an idle one.
func (l *Limiter) admit(c net.Conn) *conn {
	w := &conn{Conn: c, l: l, client: clientOf(c), since: time.Now()}
	for range 2 { // the per-client bound, then the total
		var victim *conn
		l.mu.Lock()
		switch {
		case l.perClient > 0 && l.byClient[w.client] >= l.perClient:
			victim = l.oldestIdleLocked(w.client)
		case l.total > 0 && len(l.conns) >= l.total:
			victim = l.oldestIdleLocked("")
		default:
			l.conns[w] = struct{}{}
			l.byClient[w.client]++
			l.mu.Unlock()
			return w
		}
		if victim == nil {
			l.mu.Unlock()
			return nil
		}
		l.releaseLocked(victim)
		l.mu.Unlock()
		l.evicted.Add(1)
		victim.Conn.Close() // its own Close finds it released already
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if (l.perClient > 0 && l.byClient[w.client] >= l.perClient) || (l.total > 0 && len(l.conns) >= l.total) {
		return nil
	}
	l.conns[w] = struct{}{}
	l.byClient[w.client]++
	return w
}

// oldestIdleLocked is the connection (of client, or of anyone for "") that
// has been idle the longest, nil if every one is serving a request.
func (l *Limiter) oldestIdleLocked(client string) *conn {
	var best *conn
	for c := range l.conns {
		if c.busy || (client != "" && c.client != client) {
			continue
		}
		if best == nil || c.since.Before(best.since) {
			best = c
		}
	}
	return best
}

func (l *Limiter) release(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(c)
}

func (l *Limiter) releaseLocked(c *conn) {
	if _, ok := l.conns[c]; !ok {
		return
	}
	delete(l.conns, c)
	if l.byClient[c.client]--; l.byClient[c.client] <= 0 {
		delete(l.byClient, c.client)
	}
}

// ConnState is an http.Server's ConnState hook: it tells the limiter which
// connections serve a request (those are never closed to make room).
// Without it every connection counts as busy.
func (l *Limiter) ConnState(nc net.Conn, st http.ConnState) {
	c := unwrap(nc)
	if c == nil {
		return
	}
	l.mu.Lock()
	c.busy = st == http.StateActive || st == http.StateHijacked
	c.since = time.Now()
	l.mu.Unlock()
}

// unwrap finds the limiter's connection under nc (a *tls.Conn's, say).
func unwrap(nc net.Conn) *conn {
	for nc != nil {
		if c, ok := nc.(*conn); ok {
			return c
		}
		u, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		nc = u.NetConn()
	}
	return nil
}

// BusyListener wraps inner for a server that reports no connection states
// (gRPC): its connections are never closed to make room, a new one over a
// bound is refused.
func (l *Limiter) BusyListener(inner net.Listener) net.Listener {
	return &busyListener{listener{Listener: inner, l: l}}
}

type busyListener struct{ listener }

func (ln *busyListener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ln.l.mu.Lock()
		full := (ln.l.perClient > 0 && ln.l.byClient[clientOf(c)] >= ln.l.perClient) || (ln.l.total > 0 && len(ln.l.conns) >= ln.l.total)
		if !full {
			w := &conn{Conn: c, l: ln.l, client: clientOf(c), since: time.Now(), busy: true}
			ln.l.conns[w] = struct{}{}
			ln.l.byClient[w.client]++
			ln.l.mu.Unlock()
			return w, nil
		}
		ln.l.mu.Unlock()
		ln.l.refused.Add(1)
		c.Close()
	}
}
