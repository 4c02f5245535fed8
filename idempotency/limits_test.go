package idempotency_test

import (
	"io"
	"math"
	"net/http"
	"testing"

	"github.com/guardrail-go/guardrail/idempotency"
)

// TestNoBodyLimitKeepsTheBody: MaxBodyBytes at math.MaxInt64, "no limit"
// in practice, reads the whole body: the handler sees it, and a second
// request with the key and another body is a mismatch. (max+1 used to wrap
// negative, so the body was read as empty and any body matched.)
func TestNoBodyLimitKeepsTheBody(t *testing.T) {
	var seen []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen = append(seen, string(b))
		w.WriteHeader(http.StatusCreated)
	})
	mw := newMW(idempotency.Config{MaxBodyBytes: math.MaxInt64}, h)
	wantCode(t, serve(mw, request{key: "k1", body: `{"amount":10}`}), http.StatusCreated)
	wantCode(t, serve(mw, request{key: "k1", body: `{"amount":1000000}`}), http.StatusUnprocessableEntity)
	if len(seen) != 1 || seen[0] != `{"amount":10}` {
		t.Errorf("the handler saw %q; want the first body, once", seen)
	}
}
