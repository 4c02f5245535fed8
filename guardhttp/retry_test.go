package guardhttp_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// seen is what a test server records of each request.
type seen struct {
	at       time.Time // wall clock, monotonic stripped
	mono     time.Time
	header   http.Header
	body     []byte
	timeLeft time.Duration // until the test's deadline, when the request arrived
}

// script is a server that answers the n-th request with statuses[n] (the
// last entry repeats) and records what it saw.
type script struct {
	mu       sync.Mutex
	seen     []seen
	statuses []int
	header   func(n int, h http.Header) // sets response headers; may be nil
	deadline time.Time
}

func (s *script) handler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	now := time.Now()
	s.mu.Lock()
	n := len(s.seen)
	s.seen = append(s.seen, seen{at: now.Round(0), mono: now, header: r.Header.Clone(), body: body, timeLeft: s.deadline.Sub(now)})
	status := s.statuses[min(n, len(s.statuses)-1)]
	s.mu.Unlock()
	if s.header != nil {
		s.header(n, w.Header())
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "answer "+strconv.Itoa(n+1))
}

func (s *script) requests() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.seen...)
}

func unlimited(cfg guardhttp.Config) guardhttp.Config {
	if cfg.Backoff == nil {
		cfg.Backoff = backoff.None()
	}
	cfg.Budget = budget.Unlimited()
	return cfg
}

func TestRetryAfterSecondsIsHonoured(t *testing.T) {
	sc := &script{statuses: []int{503, 200}, header: func(n int, h http.Header) {
		if n == 0 {
			h.Set("Retry-After", "1")
		}
	}}
	srv := newServer(t, sc.handler)
	c := newClient(t, unlimited(guardhttp.Config{Retry: guardrail.Retry{Backoff: backoff.Constant(time.Millisecond)}}))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := get(t, ctx, c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); resp.StatusCode != 200 || got != "answer 2" {
		t.Fatalf("got %d %q, want 200 answer 2", resp.StatusCode, got)
	}
	r := sc.requests()
	if gap := r[1].mono.Sub(r[0].mono); gap < time.Second {
		t.Errorf("retried %v after a Retry-After: 1, want no earlier than 1s", gap)
	} else if gap > time.Second+slack {
		t.Errorf("retried %v after a Retry-After: 1", gap)
	}
}

func TestRetryAfterLongerThanTheTimeLeftReturnsTheResponse(t *testing.T) {
	sc := &script{statuses: []int{503}, header: func(n int, h http.Header) { h.Set("Retry-After", "1") }}
	srv := newServer(t, sc.handler)
	c := newClient(t, unlimited(guardhttp.Config{}))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	resp, err := get(t, ctx, c, srv.URL)
	if err != nil {
		t.Fatalf("err = %v, want the 503 itself", err)
	}
	if got := readAll(t, resp); resp.StatusCode != 503 || got != "answer 1" {
		t.Errorf("got %d %q, want the server's 503 with its body", resp.StatusCode, got)
	}
	if resp.Header.Get("Retry-After") != "1" {
		t.Errorf("Retry-After = %q, want the server's", resp.Header.Get("Retry-After"))
	}
	if got := len(sc.requests()); got != 1 {
		t.Errorf("server saw %d requests, want 1: 1 s does not fit in 500 ms", got)
	}
	within(t, "giving up", time.Since(start), 0, 200*time.Millisecond)
}

func TestRetryAfterDateIsHonoured(t *testing.T) {
	var asked time.Time
	sc := &script{statuses: []int{429, 200}}
	sc.header = func(n int, h http.Header) {
		if n == 0 {
			asked = time.Now().Add(2 * time.Second).Truncate(time.Second)
			h.Set("Retry-After", asked.UTC().Format(http.TimeFormat))
		}
	}
	srv := newServer(t, sc.handler)
	c := newClient(t, unlimited(guardhttp.Config{}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := get(t, ctx, c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200 after the retry", resp.StatusCode)
	}
	r := sc.requests()
	if len(r) != 2 {
		t.Fatalf("server saw %d requests, want 2", len(r))
	}
	if r[1].at.Before(asked) {
		t.Errorf("retried at %v, before the date asked, %v", r[1].at, asked)
	}
	if late := r[1].at.Sub(asked); late > slack {
		t.Errorf("retried %v after the date asked", late)
	}
}

func TestStatusesRetriedOrNot(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		key      string
		status   int
		retryAft string
		want     int // requests the server sees
	}{
		{"GET 503", "GET", "", 503, "", 3},
		{"GET 502", "GET", "", 502, "", 3},
		{"GET 504", "GET", "", 504, "", 3},
		{"GET 500", "GET", "", 500, "", 3},
		{"DELETE 500", "DELETE", "", 500, "", 3},
		{"GET 429 with Retry-After", "GET", "", 429, "0", 3},
		{"GET 429 without Retry-After", "GET", "", 429, "", 1},
		{"GET 501", "GET", "", 501, "", 1},
		{"GET 404", "GET", "", 404, "", 1},
		{"GET 400", "GET", "", 400, "", 1},
		{"GET 409", "GET", "", 409, "", 1},
		{"POST 503", "POST", "", 503, "", 1},
		{"POST 500", "POST", "", 500, "", 1},
		{"PATCH 503", "PATCH", "", 503, "", 1},
		{"POST 503 with a key", "POST", "k1", 503, "", 3},
		{"POST 500 with a key", "POST", "k1", 500, "", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := &script{statuses: []int{tt.status}, header: func(_ int, h http.Header) {
				if tt.retryAft != "" {
					h.Set("Retry-After", tt.retryAft)
				}
			}}
			srv := newServer(t, sc.handler)
			rec := &recorder{}
			c := newClient(t, unlimited(guardhttp.Config{Observer: rec}))
			req, err := http.NewRequest(tt.method, srv.URL, strings.NewReader("payload"))
			if err != nil {
				t.Fatal(err)
			}
			if tt.key != "" {
				req.Header.Set("Idempotency-Key", tt.key)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("err = %v, want the last response", err)
			}
			body := readAll(t, resp)
			if resp.StatusCode != tt.status || body != "answer "+strconv.Itoa(tt.want) {
				t.Errorf("got %d %q, want the last response: %d %q", resp.StatusCode, body, tt.status, "answer "+strconv.Itoa(tt.want))
			}
			if got := len(sc.requests()); got != tt.want {
				t.Errorf("server saw %d requests, want %d", got, tt.want)
			}
			// 4xx are the request's fault: the breaker must not count them.
			wantOutcome := event.AttemptFailure
			if tt.status < 500 && tt.status != 429 {
				wantOutcome = event.AttemptIgnored
			}
			if got := rec.count(event.AttemptEnd, func(e event.Event) bool { return e.Outcome == wantOutcome }); got != tt.want {
				t.Errorf("%d attempts recorded as %s, want %d", got, wantOutcome, tt.want)
			}
		})
	}
}

func TestIdempotencyKeyIsTheSameOnEveryAttempt(t *testing.T) {
	for _, tt := range []struct {
		name     string
		given    string
		generate bool
	}{
		{"given by the caller", "order-42-charge", false},
		{"generated", "", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sc := &script{statuses: []int{503, 503, 201}}
			srv := newServer(t, sc.handler)
			c := newClient(t, unlimited(guardhttp.Config{IdempotencyKeys: tt.generate}))
			req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":10}`))
			if err != nil {
				t.Fatal(err)
			}
			if tt.given != "" {
				req.Header.Set("Idempotency-Key", tt.given)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if readAll(t, resp); resp.StatusCode != 201 {
				t.Fatalf("status %d, want 201 after two retries", resp.StatusCode)
			}
			r := sc.requests()
			if len(r) != 3 {
				t.Fatalf("server saw %d requests, want 3", len(r))
			}
			key := r[0].header.Get("Idempotency-Key")
			if tt.given != "" && key != tt.given {
				t.Errorf("key = %q, want the caller's %q", key, tt.given)
			}
			if tt.generate {
				if len(key) != 32 || strings.Trim(key, "0123456789abcdef") != "" {
					t.Errorf("generated key = %q, want 128 bits in hex", key)
				}
				if got := req.Header.Get("Idempotency-Key"); got != "" {
					t.Errorf("the caller's request now has a key %q: it must not be modified", got)
				}
			}
			for i, s := range r {
				if got := s.header.Get("Idempotency-Key"); got != key {
					t.Errorf("attempt %d sent key %q, want %q on every attempt", i+1, got, key)
				}
			}
		})
	}
}

func TestGeneratedKeysDifferBetweenRequests(t *testing.T) {
	sc := &script{statuses: []int{200}}
	srv := newServer(t, sc.handler)
	c := newClient(t, guardhttp.Config{IdempotencyKeys: true})
	for i := 0; i < 2; i++ {
		resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	r := sc.requests()
	if a, b := r[0].header.Get("Idempotency-Key"), r[1].header.Get("Idempotency-Key"); a == "" || a == b {
		t.Errorf("keys %q and %q: want one per request", a, b)
	}
	if got := r[2].header.Get("Idempotency-Key"); got != "" {
		t.Errorf("a GET got a key %q: only POST and PATCH need one", got)
	}
}

// opaque hides a reader's type so http.NewRequest sets no GetBody.
type opaque struct{ io.Reader }

func TestBodyIsReplayedByteForByte(t *testing.T) {
	payload := bytes.Repeat([]byte("guardrail-"), 10_000) // 100 kB
	want := sha256.Sum256(payload)
	for _, tt := range []struct {
		name string
		body func() io.Reader
	}{
		{"GetBody", func() io.Reader { return bytes.NewReader(payload) }},
		{"buffered", func() io.Reader { return opaque{bytes.NewReader(payload)} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sc := &script{statuses: []int{503, 502, 200}}
			srv := newServer(t, sc.handler)
			c := newClient(t, unlimited(guardhttp.Config{}))
			req, err := http.NewRequest(http.MethodPut, srv.URL, tt.body())
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if readAll(t, resp); resp.StatusCode != 200 {
				t.Fatalf("status %d, want 200", resp.StatusCode)
			}
			r := sc.requests()
			if len(r) != 3 {
				t.Fatalf("server saw %d requests, want 3", len(r))
			}
			for i, s := range r {
				if sha256.Sum256(s.body) != want {
					t.Errorf("attempt %d: server got %d bytes that differ from the %d sent", i+1, len(s.body), len(payload))
				}
			}
		})
	}
}

func TestBodyTooLargeToBufferIsSentOnce(t *testing.T) {
	payload := bytes.Repeat([]byte("x"), 4096)
	sc := &script{statuses: []int{503, 200}}
	srv := newServer(t, sc.handler)
	c := newClient(t, unlimited(guardhttp.Config{MaxBufferedBody: 1024}))
	req, err := http.NewRequest(http.MethodPut, srv.URL, opaque{bytes.NewReader(payload)})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, resp); resp.StatusCode != 503 {
		t.Errorf("status %d, want the 503: the body could not be sent again", resp.StatusCode)
	}
	r := sc.requests()
	if len(r) != 1 || !bytes.Equal(r[0].body, payload) {
		t.Errorf("server saw %d requests; want 1 with the whole body", len(r))
	}
}

// closeCounter counts Close calls on a request body.
type closeCounter struct {
	io.Reader
	closes atomic.Int64
}

func (c *closeCounter) Close() error { c.closes.Add(1); return nil }

func TestCallersRequestIsNotModifiedAndItsBodyIsClosed(t *testing.T) {
	sc := &script{statuses: []int{503, 200}}
	srv := newServer(t, sc.handler)
	c := newClient(t, unlimited(guardhttp.Config{IdempotencyKeys: true}))
	body := &closeCounter{Reader: strings.NewReader("data")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Caller", "yes")
	before := req.Header.Clone()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if len(req.Header) != len(before) || req.Header.Get("X-Caller") != "yes" {
		t.Errorf("caller's headers changed: %v, were %v", req.Header, before)
	}
	if got := body.closes.Load(); got < 1 {
		t.Errorf("caller's body closed %d times, want at least once", got)
	}
	if r := sc.requests(); len(r) != 2 || r[1].header.Get("X-Caller") != "yes" {
		t.Errorf("the retry lost the caller's headers: %v", r)
	}

	// A request refused before any attempt still has its body closed.
	body2 := &closeCounter{Reader: strings.NewReader("data")}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel2()
	req2, _ := http.NewRequestWithContext(ctx2, http.MethodPost, srv.URL, body2)
	if _, err := c.Do(req2); !errors.Is(err, guardrail.ErrDeadline) {
		t.Errorf("err = %v, want ErrDeadline", err)
	}
	if got := body2.closes.Load(); got != 1 {
		t.Errorf("body of a request never sent closed %d times, want 1", got)
	}
}

func TestDeadlineAndRetryHeaders(t *testing.T) {
	const reserve = 20 * time.Millisecond
	dl := time.Now().Add(2 * time.Second)
	sc := &script{statuses: []int{503, 503, 200}, deadline: dl}
	srv := newServer(t, sc.handler)
	c := newClient(t, unlimited(guardhttp.Config{DeadlineReserve: reserve}))
	ctx, cancel := context.WithDeadline(context.Background(), dl)
	defer cancel()
	resp, err := get(t, ctx, c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	r := sc.requests()
	if len(r) != 3 {
		t.Fatalf("server saw %d requests, want 3", len(r))
	}
	for i, s := range r {
		if got, want := s.header.Get(deadline.HeaderRetryAttempt), []string{"", "1", "2"}[i]; got != want {
			t.Errorf("attempt %d: X-Retry-Attempt = %q, want %q", i+1, got, want)
		}
		got, ok := deadline.FromHeader(s.header, s.at, 0) // X-Request-Timeout first
		if !ok {
			t.Fatalf("attempt %d: X-Request-Timeout = %q", i+1, s.header.Get(deadline.HeaderTimeout))
		}
		// What the server reads against what the caller had left when the
		// request arrived: they differ by the reserve and the trip.
		if diff := got - (s.timeLeft - reserve); diff < -time.Millisecond || diff > 5*time.Millisecond {
			t.Errorf("attempt %d: X-Request-Timeout = %v, caller had %v left (reserve %v): off by %v",
				i+1, got, s.timeLeft, reserve, diff)
		}
		abs, ok := deadline.FromHeader(http.Header{deadline.HeaderDeadline: s.header.Values(deadline.HeaderDeadline)}, s.at, 0)
		if !ok {
			t.Fatalf("attempt %d: X-Request-Deadline = %q", i+1, s.header.Get(deadline.HeaderDeadline))
		}
		if diff := abs - (s.timeLeft - reserve); diff < -5*time.Millisecond || diff > 5*time.Millisecond {
			t.Errorf("attempt %d: X-Request-Deadline says %v left, want about %v", i+1, abs, s.timeLeft-reserve)
		}
	}
}

func TestAttemptTimeoutIsAnnouncedWhenItComesFirst(t *testing.T) {
	sc := &script{statuses: []int{200}}
	srv := newServer(t, sc.handler)
	c := newClient(t, guardhttp.Config{Retry: guardrail.Retry{AttemptTimeout: 300 * time.Millisecond}, DeadlineReserve: -1})
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	got, ok := deadline.FromHeader(sc.requests()[0].header, time.Now(), 0)
	if !ok || got > 300*time.Millisecond || got < 290*time.Millisecond {
		t.Errorf("X-Request-Timeout = %v, want the attempt's 300ms", got)
	}
	// Without a deadline of any kind, nothing is announced.
	c2 := newClient(t, guardhttp.Config{})
	resp, err = get(t, context.Background(), c2, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if h := sc.requests()[1].header; h.Get(deadline.HeaderTimeout) != "" || h.Get(deadline.HeaderDeadline) != "" {
		t.Errorf("deadline headers sent without a deadline: %v", h)
	}
}

func TestBudgetExhaustedAfterA503ReturnsThe503(t *testing.T) {
	sc := &script{statuses: []int{503}}
	srv := newServer(t, sc.handler)
	rec := &recorder{}
	c := newClient(t, guardhttp.Config{
		Retry: guardrail.Retry{
			MaxAttempts: 5,
			Backoff:     backoff.None(),
			Budget:      must(budget.New(budget.Config{Max: 1})),
		},
		// one retry in the bucket
		Observer: rec,
	})
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatalf("err = %v, want the 503", err)
	}
	if got := readAll(t, resp); resp.StatusCode != 503 || got != "answer 2" {
		t.Errorf("got %d %q, want the last 503", resp.StatusCode, got)
	}
	if got := len(sc.requests()); got != 2 {
		t.Errorf("server saw %d requests, want 2: the budget held one retry", got)
	}
	if got := rec.count(event.BudgetExhausted, nil); got != 1 {
		t.Errorf("%d budget_exhausted events, want 1", got)
	}
}

func TestBudgetExhaustedWithoutAResponseIsAnError(t *testing.T) {
	ln := newDeafListener(t)
	c := newClient(t, guardhttp.Config{
		ResponseHeaderTimeout: 20 * time.Millisecond,
		Retry: guardrail.Retry{
			Backoff: backoff.None(),
			Budget:  must(budget.New(budget.Config{Max: 1})),
		},
	})
	_, err := get(t, context.Background(), c, "http://"+ln.Addr().String())
	if !errors.Is(err, guardrail.ErrBudgetExhausted) {
		t.Fatalf("err = %v, want ErrBudgetExhausted", err)
	}
	var ge *guardrail.Error
	if !errors.As(err, &ge) || ge.Attempts != 2 {
		t.Errorf("err = %v, want a *guardrail.Error after 2 attempts", err)
	}
	if te := asTimeout(t, err); te.Phase != event.PhaseResponseHeader {
		t.Errorf("cause = %v, want the response_header timeout", te)
	}
}

func TestCallerCancelsDuringBackoff(t *testing.T) {
	sc := &script{statuses: []int{503}, header: func(_ int, h http.Header) { h.Set("Retry-After", "10") }}
	srv := newServer(t, sc.handler)
	ctx, cancel := context.WithCancel(context.Background())
	rec := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.Retry {
			cancel() // the caller gives up while the client waits
		}
		return ctx
	})
	pool := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(pool.CloseIdleConnections)
	base := &bodyRecorder{base: pool}
	rt, err := guardhttp.NewTransport(base, unlimited(guardhttp.Config{Observer: rec}))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := get(t, ctx, &http.Client{Transport: rt}, srv.URL)
	if resp != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, %v; want context.Canceled", resp, err)
	}
	if got := len(sc.requests()); got != 1 {
		t.Errorf("server saw %d requests, want 1", got)
	}
	// The 503 was read to its end and closed before the call returned,
	// so that net/http can reuse its connection.
	if drained, closed := base.state(); !drained || !closed {
		t.Errorf("the 503's body: read to EOF %v, closed %v; want both", drained, closed)
	}
}

// bodyRecorder is a base transport that records whether the body of the
// last response it returned was read to its end and closed.
type bodyRecorder struct {
	base http.RoundTripper
	mu   sync.Mutex
	body *recordedBody
}

type recordedBody struct {
	io.ReadCloser
	r      *bodyRecorder
	eof    bool
	closed bool
}

func (b *bodyRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.base.RoundTrip(r)
	if err == nil {
		b.mu.Lock()
		b.body = &recordedBody{ReadCloser: resp.Body, r: b}
		resp.Body = b.body
		b.mu.Unlock()
	}
	return resp, err
}

func (b *bodyRecorder) state() (drained, closed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.body == nil {
		return false, false
	}
	return b.body.eof, b.body.closed
}

func (rb *recordedBody) Read(p []byte) (int, error) {
	n, err := rb.ReadCloser.Read(p)
	if err == io.EOF {
		rb.r.mu.Lock()
		rb.eof = true
		rb.r.mu.Unlock()
	}
	return n, err
}

func (rb *recordedBody) Close() error {
	rb.r.mu.Lock()
	rb.closed = true
	rb.r.mu.Unlock()
	return rb.ReadCloser.Close()
}

func TestCustomClassifier(t *testing.T) {
	sc := &script{statuses: []int{409, 200}}
	srv := newServer(t, sc.handler)
	// This API answers 409 while a resource is being created: worth a retry.
	classify := func(resp *http.Response, err error) guardrail.Verdict {
		if resp != nil && resp.StatusCode == http.StatusConflict {
			return guardrail.Verdict{Outcome: breaker.Ignored, Retryable: true}
		}
		return guardhttp.DefaultClassify(resp, err)
	}
	c := newClient(t, unlimited(guardhttp.Config{Classify: classify}))
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, resp); resp.StatusCode != 200 || len(sc.requests()) != 2 {
		t.Errorf("status %d after %d requests, want 200 after 2", resp.StatusCode, len(sc.requests()))
	}
}

// An invalid Config is refused when the client is built, with an error
// that names the field; what negative means no limit is accepted.
func TestInvalidConfigIsRefusedAtConstruction(t *testing.T) {
	_, err := guardhttp.NewClient(guardhttp.Config{Retry: guardrail.Retry{MaxAttempts: -1}})
	if !errors.Is(err, guardhttp.ErrInvalidConfig) || !strings.Contains(err.Error(), "Config.MaxAttempts is -1") {
		t.Errorf("NewClient: err = %v, want one naming Config.MaxAttempts", err)
	}
	if _, err := guardhttp.NewTransport(nil, guardhttp.Config{Retry: guardrail.Retry{MaxAttempts: -2}}); !errors.Is(err, guardhttp.ErrInvalidConfig) {
		t.Errorf("NewTransport: err = %v, want ErrInvalidConfig", err)
	}
	_, err = guardhttp.NewClient(guardhttp.Config{Bulkhead: &bulkhead.Config{MaxConcurrent: -1}})
	if !errors.Is(err, guardhttp.ErrInvalidConfig) || !strings.Contains(err.Error(), "Config.Bulkhead") {
		t.Errorf("NewClient with a bad bulkhead: err = %v, want one naming Config.Bulkhead", err)
	}
	for _, bad := range []struct {
		cfg   guardhttp.Config
		field string
	}{
		{guardhttp.Config{Retry: guardrail.Retry{AttemptTimeout: -1}}, "Config.AttemptTimeout is -1ns"},
		{guardhttp.Config{MaxBufferedBody: -1}, "Config.MaxBufferedBody is -1"},
	} {
		if _, err := guardhttp.NewClient(bad.cfg); !errors.Is(err, guardhttp.ErrInvalidConfig) || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("NewClient(%+v): err = %v, want one naming %s", bad.cfg, err, bad.field)
		}
	}
	noLimits := guardhttp.Config{
		Retry: guardrail.Retry{
			MinAttemptTime: -1,
			MaxRetryAfter:  -1,
		},
		ConnectTimeout: -1, TLSHandshakeTimeout: -1,
		WriteTimeout: -1, ResponseHeaderTimeout: -1, BodyIdleTimeout: -1,
		DeadlineReserve: -1}
	c := newClient(t, noLimits)
	sc := &script{statuses: []int{200}}
	srv := newServer(t, sc.handler)
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatalf("no limits: %v", err)
	}
	resp.Body.Close()
}
