package chain_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/shed"
)

func TestParseAmplification(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"1", 1, true},
		{" 12 ", 12, true},
		{"0", 1, true},
		{"999999999", chain.MaxAmplification, true},
		{"1000000000", 0, false},
		{"-3", 0, false},
		{"+3", 0, false},
		{"3.5", 0, false},
		{"", 0, false},
		{"abc", 0, false},
	} {
		got, ok := chain.ParseAmplification(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseAmplification(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzParseAmplification(f *testing.F) {
	for _, s := range []string{"1", "64", " 7", "999999999", "-1", "1e3", "\x00", "18446744073709551617"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := chain.ParseAmplification(s)
		if !ok {
			return
		}
		if n < 1 || n > chain.MaxAmplification {
			t.Fatalf("ParseAmplification(%q) = %d, outside [1, %d]", s, n, chain.MaxAmplification)
		}
		st := chain.NewState(n, chain.DefaultMaxAmplification)
		for _, a := range []int{1, 2, 1 << 30, int(^uint(0) >> 1)} {
			if out := st.Outgoing(a); out < n || out > chain.MaxAmplification {
				t.Fatalf("Outgoing(%d) of %d = %d", a, n, out)
			}
		}
	})
}

func FuzzParseMarker(f *testing.F) {
	for _, s := range []string{"1", " 1 ", "0", "true", "11", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if chain.ParseMarker(s) != (strings.Trim(s, " \t") == "1") {
			t.Fatalf("ParseMarker(%q) = %v", s, chain.ParseMarker(s))
		}
	})
}

func TestStateCap(t *testing.T) {
	st := chain.NewState(4, 10)
	for n, want := range map[int]bool{1: true, 2: true, 3: false} {
		if got := st.AllowsAttempt(n); got != want {
			t.Errorf("amplification 4, cap 10: AllowsAttempt(%d) = %v, want %v", n, got, want)
		}
	}
	var none *chain.State
	if !none.AllowsAttempt(100) || none.Amplification() != 1 || none.Outgoing(3) != 3 || none.Retried() {
		t.Error("a nil State must allow everything, be amplification 1 and carry no marker")
	}
	none.MarkRetried() // no panic
	none.MarkNotProcessed()
	uncapped := chain.NewState(1000, 0)
	if !uncapped.AllowsAttempt(1000) {
		t.Error("cap 0 means none")
	}
}

// MarkRetried wins over MarkNotProcessed: once a guarded call ran for the
// request, it was processed.
func TestStateRetriedBeatsNotProcessed(t *testing.T) {
	st := chain.NewState(1, 0)
	st.MarkNotProcessed()
	if !st.NotProcessed() {
		t.Fatal("NotProcessed after MarkNotProcessed")
	}
	st.MarkRetried()
	if st.NotProcessed() || !st.Retried() {
		t.Errorf("NotProcessed %v, Retried %v; want false, true", st.NotProcessed(), st.Retried())
	}
}

func TestNewRejectsNegativeCap(t *testing.T) {
	_, err := chain.New(chain.Config{MaxAmplification: -1})
	if !errors.Is(err, chain.ErrInvalidConfig) {
		t.Fatalf("New(MaxAmplification -1) = %v, want ErrInvalidConfig", err)
	}
	s, err := chain.New(chain.Config{})
	if err != nil || s.MaxAmplification() != chain.DefaultMaxAmplification {
		t.Fatalf("New(zero) = %v, %v; want the default cap", s, err)
	}
}

// Every refusal at the door of the middlewares that make it (deadline,
// shed) is marked not processed when they run inside the chain's.
func TestMiddlewareMarksRefusalsAtTheDoor(t *testing.T) {
	cs, _ := chain.New(chain.Config{})
	dl, err := deadline.New(deadline.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := shed.New(shed.Config{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	hold, release := make(chan struct{}), make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Hold") != "" {
			close(hold)
			<-release
		}
		w.WriteHeader(http.StatusServiceUnavailable) // worked, then failed: no marker
	})
	srv := httptest.NewServer(cs.Middleware(dl.Middleware(sh.Middleware(handler))))
	defer srv.Close()

	do := func(h http.Header) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}

	// Its deadline already passed: refused by deadline.
	if resp := do(http.Header{deadline.HeaderTimeout: {"0"}}); resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get(chain.HeaderNotProcessed) != "1" {
		t.Errorf("expired: %d, %s=%q; want 504 marked", resp.StatusCode, chain.HeaderNotProcessed, resp.Header.Get(chain.HeaderNotProcessed))
	}
	// One request holds the only slot; the next is shed.
	done := make(chan *http.Response)
	go func() { done <- do(http.Header{"Hold": {"1"}}) }()
	<-hold
	if resp := do(http.Header{}); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(chain.HeaderNotProcessed) != "1" {
		t.Errorf("shed: %d, %s=%q; want 503 marked", resp.StatusCode, chain.HeaderNotProcessed, resp.Header.Get(chain.HeaderNotProcessed))
	}
	close(release)
	if resp := <-done; resp.Header.Get(chain.HeaderNotProcessed) != "" || resp.Header.Get(chain.HeaderRetried) != "" {
		t.Errorf("a handler's own 503 carries %v; want no marker", resp.Header)
	}
}

// A guarded call that gave up after retries marks the request's answer
// only when it is an error: a handler that recovered (a fallback) answers
// 200 without it.
func TestMiddlewareMarksOnlyErrorAnswers(t *testing.T) {
	cs, _ := chain.New(chain.Config{})
	p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{MaxAttempts: 2}}
	srv := httptest.NewServer(cs.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := guardrail.Do(r.Context(), p, func(context.Context) (int, error) { return 0, errors.New("down") })
		if err == nil {
			t.Error("the call must fail")
		}
		if r.URL.Query().Get("fallback") != "" {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})))
	defer srv.Close()
	for _, tc := range []struct {
		query, want string
	}{{"", "1"}, {"?fallback=1", ""}} {
		resp, err := http.Get(srv.URL + tc.query)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get(chain.HeaderRetried); got != tc.want {
			t.Errorf("%q: %s = %q, want %q", tc.query, chain.HeaderRetried, got, tc.want)
		}
	}
}

// The Observer sees every request's amplification, for a histogram.
func TestMiddlewareReportsAmplification(t *testing.T) {
	var got []event.Event
	obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		got = append(got, e)
		return ctx
	})
	cs, _ := chain.New(chain.Config{Name: "orders", Observer: obs})
	h := cs.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, v := range []string{"", "6", "garbage"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if v != "" {
			r.Header.Set(chain.HeaderAmplification, v)
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	want := []int{1, 6, 1}
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d", len(got), len(want))
	}
	for i, e := range got {
		if e.Kind != event.Amplification || e.Amplification != want[i] || e.Dependency != "orders" || e.Limit != chain.DefaultMaxAmplification {
			t.Errorf("event %d = %+v, want amplification %d", i, e, want[i])
		}
	}
}
