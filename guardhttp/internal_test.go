package guardhttp

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/idempotency"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/deadline"
)

// A connect timeout of NewClient's transport, DNS included, whichever of
// its dialer's bound and the attempt's timer ends it first: it is named,
// counts the configured limit, and, the request having never left, is
// retried even for a POST.
func TestNewClientConnectTimeout(t *testing.T) {
	const limit = 50 * time.Millisecond
	c, err := NewClient(Config{ConnectTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 2, Backoff: backoff.None()}})
	if err != nil {
		t.Fatal(err)
	}
	tr := c.Transport.(*Transport)
	// NewClient's dialer, resolving through a DNS server that never answers.
	var dials atomic.Int64
	stop := make(chan struct{})
	defer close(stop) // ends the lookups the dials gave up on
	hanging := &net.Dialer{Timeout: tr.s.connect, Resolver: hangingResolver(stop)}
	tr.base.(*http.Transport).DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return hanging.DialContext(ctx, network, addr)
	}
	defer c.CloseIdleConnections()

	start := time.Now()
	resp, err := c.Post("http://never.resolves.test/pay", "text/plain", strings.NewReader("x"))
	elapsed := time.Since(start)
	if resp != nil {
		resp.Body.Close()
		t.Fatal("got a response")
	}
	var te *TimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *TimeoutError", err)
	}
	if te.Phase != event.PhaseConnect || te.After != limit || te.Dependency != "never.resolves.test" {
		t.Errorf("timeout = %+v, want connect after %v for never.resolves.test", te, limit)
	}
	if errors.Is(err, guardrail.ErrOutcomeUnknown) {
		t.Errorf("err = %v: a request that never left has a known outcome", err)
	}
	if got := dials.Load(); got != 2 {
		t.Errorf("%d dials, want 2: a POST never sent is retried", got)
	}
	if elapsed < 2*limit || elapsed > 2*limit+time.Second {
		t.Errorf("two attempts took %v, want about %v", elapsed, 2*limit)
	}
}

// A base transport that gives up connecting an instant before the
// attempt's timer fires (NewClient bounds its dialer by the same limit)
// still ends the attempt with a connect timeout: the phase's limit had run
// out on guardhttp's own clock, whatever the base's error says.
func TestBaseGivingUpAsTheConnectLimitRunsOut(t *testing.T) {
	const limit = 40 * time.Millisecond
	tr, err := NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		time.Sleep(limit + 10*time.Millisecond) // the timer may or may not have fired
		return nil, errors.New("some error of the base transport")
	}), Config{ConnectTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	tr.http = &http.Transport{} // connecting from the start, as *http.Transport
	req, _ := http.NewRequest(http.MethodGet, "http://example.test/", nil)
	_, err = tr.RoundTrip(req)
	var te *TimeoutError
	if !errors.As(err, &te) || te.Phase != event.PhaseConnect || te.After != limit {
		t.Fatalf("err = %v, want a connect timeout after %v", err, limit)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// hangingResolver answers no DNS query: a lookup lasts until its context
// ends or stop is closed.
func hangingResolver(stop <-chan struct{}) *net.Resolver {
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-stop:
				return nil, errors.New("test over")
			}
		},
	}
}

// deadlineValues writes what deadline.Set writes.
func TestDeadlineValuesMatchDeadlineSet(t *testing.T) {
	now := time.Now()
	for _, d := range []time.Duration{-time.Second, 0, time.Millisecond - 1, time.Millisecond, 1500 * time.Microsecond,
		5 * time.Second, time.Hour, 365 * 24 * time.Hour} {
		h := http.Header{}
		deadline.Set(h, now, d)
		var buf [40]byte
		timeout, at := deadlineValues(now, d, &buf)
		if timeout != h.Get(deadline.HeaderTimeout) || at != h.Get(deadline.HeaderDeadline) {
			t.Errorf("d = %v: got %q, %q; deadline.Set wrote %q, %q", d, timeout, at,
				h.Get(deadline.HeaderTimeout), h.Get(deadline.HeaderDeadline))
		}
	}
}

// The headers of an attempt are the caller's plus ours, each of ours a
// slice of its own, and the caller's map is left as it was.
func TestAttemptHeaders(t *testing.T) {
	tr, err := NewTransport(http.DefaultTransport, Config{DeadlineReserve: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://example.test/", nil)
	req.Header.Set("X-Caller", "yes")
	before := req.Header.Clone()
	c := &call{t: tr, req: req, n: 3, idemKey: "k1", chain: chain.NewState(2, 0)}
	dl, need := c.headers(&attempt{}, c.n)
	if !need || !dl.Equal(func() time.Time { d, _ := ctx.Deadline(); return d }()) {
		t.Fatalf("headers() = %v, %v: want the context's deadline, and headers needed", dl, need)
	}
	var vals [6]string
	var digits [40]byte
	h := c.header(dl, time.Now(), c.n, &vals, &digits)
	// The request being served arrived as 2 sends of its user's; this is
	// the third attempt: 6.
	for key, want := range map[string]string{"X-Caller": "yes", deadline.HeaderRetryAttempt: "2", idempotency.HeaderKey: "k1", chain.HeaderAmplification: "6"} {
		if got := h[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s = %q, want [%q]", key, got, want)
		}
	}
	if d, ok := deadline.FromHeader(h, time.Now(), 0); !ok || d < 59*time.Second || d > time.Minute {
		t.Errorf("%s = %q, want about a minute", deadline.HeaderTimeout, h.Get(deadline.HeaderTimeout))
	}
	h.Add(deadline.HeaderRetryAttempt, "appended") // must not spill into the next key's value
	if got := h[idempotency.HeaderKey]; len(got) != 1 || got[0] != "k1" {
		t.Errorf("appending to one header changed another: %q", got)
	}
	if len(req.Header) != len(before) || req.Header.Get("X-Caller") != "yes" {
		t.Errorf("caller's headers changed: %v", req.Header)
	}
}

// NewClient's transport is the one described in its documentation.
func TestNewClientBase(t *testing.T) {
	c, err := NewClient(Config{ConnectTimeout: -1, TLSHandshakeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	base := c.Transport.(*Transport).base.(*http.Transport)
	if base.Proxy == nil || !base.ForceAttemptHTTP2 || base.MaxIdleConnsPerHost != DefaultMaxIdleConnsPerHost ||
		base.TLSHandshakeTimeout != 2*time.Second || base.ResponseHeaderTimeout != 0 {
		t.Errorf("base transport = %+v", base)
	}
}
