package guardhttp_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/respond"
)

// fastRetry is a retry setting with three attempts and no wait between
// them, so the tests count sends without timing anything.
var fastRetry = guardrail.Retry{MaxAttempts: 3, Backoff: backoff.None()}

// tier is one server of a chain: it serves every request by calling next
// through a guardhttp client with fastRetry, behind a chain Server when
// withChain is set, and counts what it saw.
type tier struct {
	srv  *httptest.Server
	seen atomic.Int64
	amps sync.Map // amplification header value -> count
}

func newTier(t *testing.T, next string, withChain bool, max int) *tier {
	t.Helper()
	client := newClient(t, guardhttp.Config{Retry: fastRetry})
	tr := &tier{}
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.seen.Add(1)
		tr.note(r)
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, next, nil)
		resp, err := client.Do(req)
		if err != nil {
			respond.Error(w, err)
			return
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode >= 400 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	if withChain {
		cs, err := chain.New(chain.Config{MaxAmplification: max})
		if err != nil {
			t.Fatal(err)
		}
		h = cs.Middleware(h)
	}
	tr.srv = httptest.NewServer(h)
	t.Cleanup(tr.srv.Close)
	return tr
}

func (tr *tier) note(r *http.Request) {
	v := r.Header.Get(chain.HeaderAmplification)
	n, _ := tr.amps.LoadOrStore(v, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

func (tr *tier) ampCount(v string) int64 {
	n, ok := tr.amps.Load(v)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// A failing bottom behind two guardrail tiers that retry 3 times each:
// with the chain's markers, only the tier next to the failure retries, so
// the bottom sees 3 sends of the user's request, not 9; without them the
// tier above retries the answer of the tier below, and the sends multiply.
func TestChainAlreadyRetriedStopsMultiplication(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		withChain            bool
		wantMiddle, wantBase int64
		wantMarker           string
	}{
		{"markers", true, 1, 3, "1"},
		{"no markers", false, 3, 9, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var base atomic.Int64
			bottom := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				base.Add(1)
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			defer bottom.Close()
			middle := newTier(t, bottom.URL, tc.withChain, 0)
			top := newTier(t, middle.srv.URL, tc.withChain, 0)

			resp, err := http.Get(top.srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusBadGateway {
				t.Errorf("status %d, want a 5xx", resp.StatusCode)
			}
			if got := resp.Header.Get(chain.HeaderRetried); got != tc.wantMarker {
				t.Errorf("%s = %q at the user, want %q: the marker is passed on by the tier that gives up", chain.HeaderRetried, got, tc.wantMarker)
			}
			if got := top.seen.Load(); got != 1 {
				t.Errorf("top saw %d requests, want 1", got)
			}
			if got := middle.seen.Load(); got != tc.wantMiddle {
				t.Errorf("middle saw %d requests, want %d", got, tc.wantMiddle)
			}
			if got := base.Load(); got != tc.wantBase {
				t.Errorf("bottom saw %d requests, want %d", got, tc.wantBase)
			}
		})
	}
}

// The amplification multiplies along the chain, and a server's cap
// refuses the retries that would take one user request past it.
func TestChainAmplificationCap(t *testing.T) {
	bottom := &tier{}
	bottom.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bottom.seen.Add(1)
		bottom.note(r)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer bottom.Close()
	middle := newTier(t, bottom.srv.URL, true, 10)

	// The request arrives as 4 sends of its user's: attempt 1 is 4,
	// attempt 2 is 8, attempt 3 would be 12, past the cap of 10.
	req, _ := http.NewRequest(http.MethodGet, middle.srv.URL, nil)
	req.Header.Set(chain.HeaderAmplification, "4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := bottom.seen.Load(); got != 2 {
		t.Errorf("bottom saw %d requests, want 2: the third attempt passes the cap", got)
	}
	if a, b := bottom.ampCount("4"), bottom.ampCount("8"); a != 1 || b != 1 {
		t.Errorf("bottom saw amplification 4 ×%d and 8 ×%d, want once each", a, b)
	}
	if got := resp.Header.Get(chain.HeaderRetried); got != "1" {
		t.Errorf("%s = %q, want 1: a refusal at the cap is a spent retry", chain.HeaderRetried, got)
	}
}

// Close is for the tier's server, so a tier reads like a server.
func (tr *tier) Close() { tr.srv.Close() }

// A request refused before its handler ran is marked, and a guardrail
// client retries it even when it is a POST without an idempotency key;
// without the marker the same POST is not retried.
func TestChainNotProcessedMakesPostRetryable(t *testing.T) {
	for _, marked := range []bool{true, false} {
		var handled, refused atomic.Int64
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handled.Add(1)
			b, _ := io.ReadAll(r.Body)
			_, _ = w.Write(b)
		})
		// The door refuses the first request, as a shedder would.
		door := func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if refused.Add(1) == 1 {
					if marked {
						chain.MarkNotProcessed(r.Context())
					}
					w.Header().Set("Retry-After", "0")
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				next.ServeHTTP(w, r)
			})
		}
		cs, err := chain.New(chain.Config{})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(cs.Middleware(door(handler)))
		client := newClient(t, guardhttp.Config{Retry: fastRetry})
		resp, err := client.Post(srv.URL, "text/plain", strings.NewReader("order 1"))
		if err != nil {
			var se *guardhttp.StatusError
			if marked || !errors.As(err, &se) {
				t.Fatalf("marked=%v: %v", marked, err)
			}
		} else {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !marked && resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("unmarked: got %d %q, want the 503", resp.StatusCode, body)
			} else if marked && (resp.StatusCode != http.StatusOK || string(body) != "order 1") {
				t.Errorf("marked: got %d %q, want 200 with the body sent again", resp.StatusCode, body)
			}
		}
		want := int64(2)
		if !marked {
			want = 1
		}
		if got := refused.Load(); got != want {
			t.Errorf("marked=%v: the server saw %d POSTs, want %d", marked, got, want)
		}
		if got := handled.Load(); got != want-1 {
			t.Errorf("marked=%v: the handler ran %d times, want %d", marked, got, want-1)
		}
		srv.Close()
	}
}

// A handler cannot send the not-processed marker: the Middleware removes
// it, since only a refusal at the door may claim that nothing ran.
func TestChainHandlerCannotClaimNotProcessed(t *testing.T) {
	cs, _ := chain.New(chain.Config{})
	srv := httptest.NewServer(cs.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(chain.HeaderNotProcessed, "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	})))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Values(chain.HeaderNotProcessed); len(got) != 0 {
		t.Errorf("%s = %q, want none", chain.HeaderNotProcessed, got)
	}
}

// A request served for a user of some cohort carries it downstream, and
// the dependency's admission level is kept for the caller's door.
func TestChainCohortAndAdmissionLevel(t *testing.T) {
	var got atomic.Value
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get(chain.HeaderCohort))
		w.Header().Set(chain.HeaderAdmission, "40")
	}))
	defer down.Close()
	tr := newTransport(t, nil, guardhttp.Config{})
	client := &http.Client{Transport: tr}
	st := chain.NewState(1, 0)
	st.SetCohort(77)
	req, _ := http.NewRequestWithContext(chain.NewContext(t.Context(), st), http.MethodGet, down.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got.Load() != "77" {
		t.Errorf("downstream saw cohort %q, want 77", got.Load())
	}
	if lvl := tr.AdmissionLevel(); lvl != 40 {
		t.Errorf("AdmissionLevel %d, want 40", lvl)
	}
}
