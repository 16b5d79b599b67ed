package openai

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"time"
)

// Limits bound what one request may hold of a connection.
type Limits struct {
	// A body must arrive within BodyTimeout plus its size at MinBodyRate
	// bytes/s (0, 0: DefaultBodyTimeout, DefaultMinBodyRate).
	BodyTimeout time.Duration
	MinBodyRate int
	// WriteTimeout bounds each write (and flush) of a response: a client
	// that stops reading fails the write and its request is cancelled; a
	// stream that makes progress is never cut (0: DefaultWriteTimeout).
	WriteTimeout time.Duration
}

// Defaults of Limits (configs/serve.yaml has the same).
const (
	DefaultBodyTimeout  = 10 * time.Second
	DefaultMinBodyRate  = 4096
	DefaultWriteTimeout = 30 * time.Second
)

func (l Limits) withDefaults() Limits {
	if l.BodyTimeout <= 0 {
		l.BodyTimeout = DefaultBodyTimeout
	}
	if l.MinBodyRate <= 0 {
		l.MinBodyRate = DefaultMinBodyRate
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = DefaultWriteTimeout
	}
	return l
}

// Bound wraps next with the per-request limits: the body's read deadline
// moves with the bytes received (BodyTimeout + received/MinBodyRate from
// the first read) and is lifted once the body is read, so that it never
// touches a response that streams; every write and flush gets a deadline
// of its own. A server without ReadTimeout and WriteTimeout (which would
// cut long streams) uses this instead.
func (l Limits) Bound(next http.Handler) http.Handler {
	l = l.withDefaults()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		var body *rateBody
		if r.Body != nil && r.Body != http.NoBody {
			body = &rateBody{ReadCloser: r.Body, rc: rc, l: l}
			r.Body = body
		}
		dw := &deadlineWriter{ResponseWriter: w, rc: rc, d: l.WriteTimeout}
		next.ServeHTTP(dw, r)
		if body != nil && !body.done {
			// The server discards what is left of an unread body: bounded.
			_ = rc.SetReadDeadline(time.Now().Add(l.BodyTimeout))
		}
	})
}

// errBodyTimeout is a body that arrived too slowly.
var errBodyTimeout = errors.New("body too slow")

// rateBody is a request body under a moving read deadline.
type rateBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	l     Limits
	start time.Time
	n     int64
	done  bool
}

func (b *rateBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	if b.start.IsZero() {
		b.start = time.Now()
	}
	allowed := b.l.BodyTimeout + time.Duration(b.n)*time.Second/time.Duration(b.l.MinBodyRate)
	_ = b.rc.SetReadDeadline(b.start.Add(allowed))
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	if err != nil {
		b.done = true
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return n, fmt.Errorf("%w: %d bytes in %s (server.body_timeout %s, server.min_body_rate %d bytes/s)",
				errBodyTimeout, b.n, time.Since(b.start).Round(time.Millisecond), b.l.BodyTimeout, b.l.MinBodyRate)
		}
		_ = b.rc.SetReadDeadline(time.Time{}) // the body is read: a stream's response must not time out
	}
	return n, err
}

// deadlineWriter gives every write and flush a deadline of its own, and
// remembers the first failure (a later write fails at once).
type deadlineWriter struct {
	http.ResponseWriter
	rc  *http.ResponseController
	d   time.Duration
	err error
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	n, err := w.ResponseWriter.Write(b)
	if err != nil {
		w.err = err
	}
	return n, err
}

// FlushError flushes within the write deadline (http.ResponseController
// finds it).
func (w *deadlineWriter) FlushError() error {
	if w.err != nil {
		return w.err
	}
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	if err := w.rc.Flush(); err != nil {
		w.err = err
		return err
	}
	return nil
}

// Flush implements http.Flusher.
func (w *deadlineWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the connection.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// jsonBody refuses a POST whose Content-Type is not application/json: a
// browser sends text/plain, form and multipart bodies cross-origin without
// a preflight, JSON never.
func jsonBody(r *http.Request) *apiError {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if ct == "" || err != nil || mt != "application/json" {
		return &apiError{status: http.StatusUnsupportedMediaType, typ: "invalid_request_error", param: "Content-Type",
			msg: fmt.Sprintf("Content-Type: the body must be application/json, got %q", ct)}
	}
	return nil
}
