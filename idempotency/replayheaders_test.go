package idempotency_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/guardrail-go/guardrail/idempotency"
)

// TestLowerCaseMethodsAreNotABypass: "post" and "Post" are POST to the
// middleware: Required refuses them without a key, and with one they are
// deduplicated together with "POST" (the handler runs once for the key).
// They used to pass through untouched, running the handler every time.
func TestLowerCaseMethodsAreNotABypass(t *testing.T) {
	for _, method := range []string{"post", "Post", "pOsT"} {
		t.Run(method, func(t *testing.T) {
			h := &counter{}
			mw := newMW(idempotency.Config{Required: true}, h)
			wantCode(t, serve(mw, request{method: method}), http.StatusBadRequest)
			if n := h.runs.Load(); n != 0 {
				t.Fatalf("keyless %s ran the handler %d times under Required", method, n)
			}
			first := serve(mw, request{method: method, key: "k", body: "a"})
			wantCode(t, first, http.StatusCreated)
			for _, again := range []string{method, http.MethodPost} {
				rec := serve(mw, request{method: again, key: "k", body: "a"})
				wantCode(t, rec, http.StatusCreated)
				if rec.Header().Get(idempotency.HeaderReplayed) != "true" {
					t.Errorf("%s after %s: not a replay", again, method)
				}
			}
			if n := h.runs.Load(); n != 1 {
				t.Errorf("handler ran %d times for one key, want 1", n)
			}
		})
	}
	t.Run("Methods listed in lower case", func(t *testing.T) {
		h := &counter{}
		mw := newMW(idempotency.Config{Methods: []string{"put"}}, h)
		serve(mw, request{method: http.MethodPut, key: "k"})
		serve(mw, request{method: "Put", key: "k"})
		if n := h.runs.Load(); n != 1 {
			t.Errorf("handler ran %d times for one key, want 1", n)
		}
	})
}

// TestReplayCarriesOnlyWhatTheHandlerWrote: a replay carries the fields
// the handler set, not credentials (however their name is cased), and not
// the fields outer middlewares set before it, whose live values a replay
// keeps.
func TestReplayCarriesOnlyWhatTheHandlerWrote(t *testing.T) {
	var req atomic.Int32
	// outer plays a CORS, request-ID and rate-limit middleware: it sets
	// its fields before calling the idempotency middleware, anew for
	// each request.
	outer := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := req.Add(1)
			w.Header().Set("Access-Control-Allow-Origin", fmt.Sprintf("https://site%d.example", n))
			w.Header().Set("X-Request-Id", fmt.Sprintf("req-%d", n))
			w.Header().Set("Ratelimit-Remaining", fmt.Sprint(100-n))
			w.Header().Set("Content-Type", "text/plain") // the handler overrides it
			next.ServeHTTP(w, r)
		})
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["set-cookie"] = []string{"session=secret"} // non-canonical on purpose
		h["authorization"] = []string{"Bearer secret"}
		h.Set("X-Auth-Token", "secret")
		h.Set("Proxy-Authorization", "Basic c2VjcmV0")
		h.Set("X-Api-Key", "secret")
		h.Set("Location", "/payments/1")
		h.Set("Www-Authenticate", `Bearer realm="api"`)
		h["x-lower"] = []string{"kept"}
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
	})
	for _, tt := range []struct {
		name    string
		cfg     idempotency.Config
		want    map[string]string
		notWant []string
	}{
		{
			name:    "default",
			want:    map[string]string{"Location": "/payments/1", "X-Lower": "kept", "Content-Type": "application/json", "WWW-Authenticate": `Bearer realm="api"`},
			notWant: []string{"Set-Cookie", "Authorization", "X-Auth-Token", "Proxy-Authorization", "X-Api-Key"},
		},
		{
			name:    "listed",
			cfg:     idempotency.Config{StoredHeaders: []string{"location", "SET-COOKIE", "x-request-id"}},
			want:    map[string]string{"Location": "/payments/1", "Set-Cookie": "session=secret"},
			notWant: []string{"Authorization", "X-Lower"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req.Store(0)
			mw := outer(newMW(tt.cfg, handler))
			serve(mw, request{key: "k"})
			rec := serve(mw, request{key: "k"})
			wantCode(t, rec, http.StatusCreated)
			got := rec.Header()
			if got.Get(idempotency.HeaderReplayed) != "true" {
				t.Fatal("second request not replayed")
			}
			for name, v := range tt.want {
				if g := headerFold(got, name); g != v {
					t.Errorf("replay %s = %q, want %q", name, g, v)
				}
			}
			for _, name := range tt.notWant {
				if g := headerFold(got, name); g != "" {
					t.Errorf("replay carries %s: %q", name, g)
				}
			}
			// The outer middleware's fields are live, the second request's.
			for name, v := range map[string]string{
				"Access-Control-Allow-Origin": "https://site2.example", "X-Request-Id": "req-2", "Ratelimit-Remaining": "98",
			} {
				if g := got.Values(name); len(g) != 1 || g[0] != v {
					t.Errorf("replay %s = %q, want the live %q", name, g, v)
				}
			}
		})
	}
}

// headerFold returns the values of the field named name, matched without
// regard to case, joined by commas.
func headerFold(h http.Header, name string) string {
	var vs []string
	for k, v := range h {
		if strings.EqualFold(k, name) {
			vs = append(vs, v...)
		}
	}
	return strings.Join(vs, ",")
}

// FuzzMethodsAndStoredFields: whatever the method's case and the names of
// the fields the handler sets, a method that spells POST is never let
// through without a key under Required, a replay never carries a field
// whose name is a credential's in any case, and an outer middleware's
// field keeps its live value.
func FuzzMethodsAndStoredFields(f *testing.F) {
	for _, seed := range [][2]string{
		{"POST", "Location"}, {"post", "set-cookie"}, {"pOST", "AUTHORIZATION"}, {"GET", "x-auth-token"},
		{"PoSt", "X-Request-Id"}, {"PATCH", "Proxy-Authorization"}, {"PUT", "x-api-key"}, {"post", "Set-Cookie2"},
	} {
		f.Add(seed[0], seed[1], "v")
	}
	f.Fuzz(func(t *testing.T, method, field, value string) {
		if !validMethod(method) || !validFieldName(field) || strings.ContainsAny(value, "\r\n\x00") {
			t.Skip()
		}
		var runs atomic.Int32
		mw := newMW(idempotency.Config{Required: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header()[field] = []string{value}
			w.Header().Set("X-Request-Id", "handler") // overrides the outer one's
			w.WriteHeader(http.StatusOK)
		}))
		post := strings.EqualFold(method, http.MethodPost)
		noKey := httptest.NewRequest(method, "/p", nil)
		rec := httptest.NewRecorder()
		mw.ServeHTTP(rec, noKey)
		if post && (rec.Code != http.StatusBadRequest || runs.Load() != 0) {
			t.Fatalf("%q without a key under Required: %d, %d runs", method, rec.Code, runs.Load())
		}
		var last *httptest.ResponseRecorder
		for i := range 2 {
			req := httptest.NewRequest(method, "/p", nil)
			req.Header.Set(idempotency.HeaderKey, "k")
			last = httptest.NewRecorder()
			last.Header().Set("Access-Control-Allow-Origin", "live"+strconv.Itoa(i))
			mw.ServeHTTP(last, req)
		}
		if !post || last.Header().Get(idempotency.HeaderReplayed) != "true" {
			return
		}
		if got := last.Header().Get("Access-Control-Allow-Origin"); got != "live1" {
			t.Fatalf("the outer field was frozen: %q", got)
		}
		lower := strings.ToLower(field)
		if lower == "www-authenticate" || lower == "proxy-authenticate" {
			return
		}
		for _, w := range []string{"cookie", "auth", "token", "secret", "session", "password", "apikey", "api-key", "credential"} {
			if strings.Contains(lower, w) && headerFold(last.Header(), field) != "" {
				t.Fatalf("replay carries the credential %q", field)
			}
		}
	})
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// validFieldName reports whether s is a plausible field name.
func validFieldName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
