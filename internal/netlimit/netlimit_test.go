package netlimit

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func listen(t *testing.T, l *Limiter, busy bool) (net.Listener, chan net.Conn) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := l.Listener(inner)
	if busy {
		ln = l.BusyListener(inner)
	}
	got := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(got)
				return
			}
			got <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for c := range got {
			c.Close()
		}
	})
	return ln, got
}

func closed(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	ne, ok := err.(net.Error)
	return !ok || !ne.Timeout()
}

// Over the per-client bound the oldest idle connection makes room; busy
// ones never do, and then the new connection is refused.
func TestEvictsTheOldestIdleThenRefuses(t *testing.T) {
	l := New(10, 2)
	ln, got := listen(t, l, false)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	c1, c2 := dial(), dial()
	s1, s2 := <-got, <-got
	c3 := dial()
	s3 := <-got
	require.True(t, closed(t, c1), "the oldest idle connection was closed for the new one")
	require.False(t, closed(t, c2))
	require.Equal(t, 2, l.Open())
	require.Equal(t, int64(1), l.Evicted())
	l.ConnState(s2, http.StateActive)
	l.ConnState(s3, http.StateActive)
	c4 := dial()
	require.True(t, closed(t, c4), "every connection is serving: the new one is refused")
	require.Equal(t, int64(1), l.Refused())
	require.False(t, closed(t, c3))
	l.ConnState(s3, http.StateIdle)
	s1.Close()
	s3.Close() // closing releases its place
	require.Equal(t, 1, l.Open())
	dial()
	<-got
	require.Equal(t, 2, l.Open())
}

// A busy listener (gRPC's) refuses over the total bound.
func TestBusyListenerRefuses(t *testing.T) {
	l := New(2, 2)
	ln, got := listen(t, l, true)
	var cs []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		cs = append(cs, c)
	}
	<-got
	<-got
	require.True(t, closed(t, cs[2]))
	require.False(t, closed(t, cs[0]))
	require.Equal(t, 2, l.Open())
}
