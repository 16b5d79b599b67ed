package openai

import (
	"context"
	"net/http"

	"github.com/glmflash/glmflash/core/sched"
)

// RequestIDHeader carries a request's id: the client's, when it sends one
// (vLLM and most proxies do), else one the server makes; the response
// echoes it either way.
const RequestIDHeader = "X-Request-Id"

// MaxRequestID bounds a client's request id (as gRPC's request_id).
const MaxRequestID = 128

type requestIDKey struct{}

// checkRequestID is the rule for a client's id: 1 to MaxRequestID
// printable ASCII characters, no spaces (it goes into logs and headers).
func checkRequestID(id string) *apiError {
	if len(id) > MaxRequestID {
		return badField(RequestIDHeader, "longer than %d characters", MaxRequestID)
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return badField(RequestIDHeader, "character %d is not printable ASCII (spaces are not allowed either)", i)
		}
	}
	return nil
}

// withRequestID gives a request its id (the client's X-Request-Id,
// checked, or a fresh one), echoes it in the response's X-Request-Id
// before anything is written (errors carry it too), and puts it in the
// context for the handler.
func withRequestID(s *server, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		vals := r.Header.Values(RequestIDHeader)
		id := ""
		switch {
		case len(vals) > 1:
			s.fail(w, badField(RequestIDHeader, "given %d times", len(vals)))
			return
		case len(vals) == 1 && vals[0] == "":
			s.fail(w, badField(RequestIDHeader, "empty"))
			return
		case len(vals) == 1:
			if e := checkRequestID(vals[0]); e != nil {
				s.fail(w, e)
				return
			}
			id = vals[0]
		default:
			id = sched.NewID()
		}
		w.Header().Set(RequestIDHeader, id)
		h(w, r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id)))
	}
}

// requestIDOf is the id withRequestID gave the request (a fresh one for a
// handler it did not wrap).
func requestIDOf(ctx context.Context) string {
	if id, ok := ctx.Value(requestIDKey{}).(string); ok {
		return id
	}
	return sched.NewID()
}
