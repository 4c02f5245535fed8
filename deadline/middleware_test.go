package deadline_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/deadline"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve runs one request through the middleware, with Config.Now at the
// fixed time now, and reports the time the handler's context had left (-1
// without a deadline) and whether the handler ran. It runs in a synctest
// bubble, whose clock stands still while nothing blocks, so the time left
// is exact.
func serve(t *testing.T, cfg deadline.Config, h http.Header) (w *httptest.ResponseRecorder, left time.Duration, ran bool) {
	t.Helper()
	cfg.Now = func() time.Time { return now }
	dl, err := deadline.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		mw := dl.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			left = -1
			if d, ok := r.Context().Deadline(); ok {
				left = time.Until(d)
			}
		}))
		r := httptest.NewRequest("GET", "/", nil)
		for k, v := range h {
			r.Header[k] = v
		}
		w = httptest.NewRecorder()
		mw.ServeHTTP(w, r)
	})
	return w, left, ran
}

// mustNew returns deadline.New(cfg), failing the test on an error.
func mustNew(t testing.TB, cfg deadline.Config) *deadline.Server {
	t.Helper()
	s, err := deadline.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMiddlewareSetsClampedDeadline(t *testing.T) {
	tests := []struct {
		name   string
		cfg    deadline.Config
		header map[string]string
		want   time.Duration // -1: no deadline
		runs   bool
		status int
	}{
		{"relative", deadline.Config{}, map[string]string{deadline.HeaderTimeout: "1900"}, 1890 * time.Millisecond, true, 200},
		{"relative trusted over absolute", deadline.Config{}, map[string]string{
			deadline.HeaderTimeout: "800", deadline.HeaderDeadline: epochMillis(now.Add(time.Minute))}, 790 * time.Millisecond, true, 200},
		{"absolute", deadline.Config{}, map[string]string{deadline.HeaderDeadline: epochMillis(now.Add(time.Second))}, 990 * time.Millisecond, true, 200},
		{"clamped to max", deadline.Config{Max: 2 * time.Second}, map[string]string{deadline.HeaderTimeout: "3600000"}, 1990 * time.Millisecond, true, 200},
		{"no header gets max", deadline.Config{Max: 5 * time.Second, Reserve: -1}, nil, 5 * time.Second, true, 200},
		{"no header no max", deadline.Config{Max: -1}, nil, -1, true, 200},
		{"garbage ignored", deadline.Config{Max: time.Second, Reserve: -1}, map[string]string{deadline.HeaderTimeout: "-5"}, time.Second, true, 200},
		{"custom reserve", deadline.Config{Reserve: 200 * time.Millisecond}, map[string]string{deadline.HeaderTimeout: "1900"}, 1700 * time.Millisecond, true, 200},
		{"expired absolute", deadline.Config{}, map[string]string{deadline.HeaderDeadline: epochMillis(now.Add(-time.Second))}, 0, false, 504},
		{"zero relative", deadline.Config{}, map[string]string{deadline.HeaderTimeout: "0"}, 0, false, 504},
		{"eaten by reserve", deadline.Config{}, map[string]string{deadline.HeaderTimeout: "5"}, 0, false, 504},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.header {
				h.Set(k, v)
			}
			w, left, ran := serve(t, tt.cfg, h)
			if ran != tt.runs || w.Code != tt.status {
				t.Fatalf("handler ran %v, status %d; want ran %v, status %d", ran, w.Code, tt.runs, tt.status)
			}
			if ran && left != tt.want {
				t.Fatalf("handler's deadline in %v, want %v", left, tt.want)
			}
		})
	}
}

func TestHostileHeadersAreHarmless(t *testing.T) {
	for _, v := range []string{"-1", "1e9", "NaN", "0x10", " 100", strings.Repeat("9", 10<<10), "99999999999999999999999", "\x00\xff"} {
		h := http.Header{}
		h.Set(deadline.HeaderTimeout, v)
		h.Set(deadline.HeaderDeadline, v)
		w, left, ran := serve(t, deadline.Config{Max: time.Second, Reserve: -1}, h)
		if !ran || w.Code != 200 || left != time.Second {
			t.Errorf("header %.20q: ran %v status %d deadline %v; want the server's own 1s", v, ran, w.Code, left)
		}
	}
}

// A client that gives up at 300 ms stops the handler, and the handler's
// downstream call stops with it, because both hang off the request context:
// no work goes on for an answer nobody will read.
func TestClientDisconnectStopsHandlerAndDownstream(t *testing.T) {
	downstreamStopped := make(chan time.Time, 1)
	downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			downstreamStopped <- time.Now()
		case <-time.After(10 * time.Second):
		}
	}))
	defer downstream.Close()

	handlerStopped := make(chan error, 1)
	api := httptest.NewServer(mustNew(t, deadline.Config{}).Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), "GET", downstream.URL, nil)
		resp, err := downstream.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		handlerStopped <- err
	})))
	defer api.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, "GET", api.URL, nil)
	req.Header.Set(deadline.HeaderTimeout, "1900")
	_, err := api.Client().Do(req)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("client err = %v, want its own deadline", err)
	}
	herr := <-handlerStopped
	stoppedAfter := time.Since(start)
	if !errors.Is(herr, context.Canceled) {
		t.Fatalf("handler's downstream call ended with %v, want context.Canceled", herr)
	}
	dsAt := <-downstreamStopped
	t.Logf("client disconnect -> handler stopped after %v, downstream after %v", stoppedAfter.Round(time.Millisecond), dsAt.Sub(start).Round(time.Millisecond))
	if stoppedAfter < 300*time.Millisecond || stoppedAfter > time.Second {
		t.Fatalf("handler stopped after %v, want shortly after the 300ms disconnect", stoppedAfter)
	}
}

// The deadline reaches the handler over a real socket, and a handler that
// outlives it is cut at the caller's deadline, not the server's maximum.
func TestDeadlineEndsHandlerOverHTTP(t *testing.T) {
	got := make(chan time.Duration, 1)
	srv := httptest.NewServer(mustNew(t, deadline.Config{Max: time.Minute}).Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		<-r.Context().Done()
		got <- time.Since(start)
		io.WriteString(w, "late")
	})))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set(deadline.HeaderTimeout, strconv.Itoa(250))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if d := <-got; d < 200*time.Millisecond || d > 800*time.Millisecond {
		t.Fatalf("handler ran %v, want about 240ms (250 minus the reserve)", d)
	}
}

// Config.Now is the clock the caller's absolute deadline is read on, and it
// may be far from the process's real clock (a test clock, a clock corrected
// for skew). The context deadline must still be set on the real clock: from
// an injected clock ten years in the past it used to be ten years in the
// past too, so every request ran with an expired context, and from one in
// the future it never ended.
func TestInjectedClockDoesNotMoveTheContextDeadline(t *testing.T) {
	for _, offset := range []time.Duration{-10 * 365 * 24 * time.Hour, 10 * 365 * 24 * time.Hour} {
		injected := time.Now().Add(offset)
		s := mustNew(t, deadline.Config{Reserve: -1, Now: func() time.Time { return injected }})
		for name, h := range map[string]http.Header{
			"relative": {deadline.HeaderTimeout: {"1900"}},
			"absolute": {deadline.HeaderDeadline: {epochMillis(injected.Add(1900 * time.Millisecond))}},
			"none":     {},
		} {
			want := 1900 * time.Millisecond
			if name == "none" {
				want = 30 * time.Second // the default Max
			}
			var left time.Duration
			var ctxErr error
			mw := s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				d, _ := r.Context().Deadline()
				left, ctxErr = time.Until(d), r.Context().Err()
			}))
			r := httptest.NewRequest("GET", "/", nil)
			r.Header = h
			mw.ServeHTTP(httptest.NewRecorder(), r)
			// The margin is for a loaded machine; the bug is off by years.
			if ctxErr != nil || left > want || left < want-time.Second {
				t.Errorf("clock off by %v, %s header: handler's context has %v left (err %v); want about %v",
					offset, name, left, ctxErr, want)
			}
		}
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	for _, tt := range []struct {
		cfg  deadline.Config
		want string
	}{
		{deadline.Config{Max: time.Second, Reserve: time.Second}, "deadline: Config.Reserve is 1s (1s in force); want less than Config.Max's 1s, or negative for none"},
		{deadline.Config{Max: 5 * time.Millisecond}, "deadline: Config.Reserve is 0s (10ms in force); want less than Config.Max's 5ms, or negative for none"},
		{deadline.Config{Reserve: time.Minute}, "Config.Reserve is 1m0s"},
	} {
		_, err := deadline.New(tt.cfg)
		if !errors.Is(err, deadline.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v; want an error containing %q", tt.cfg, err, tt.want)
		}
	}
	for _, cfg := range []deadline.Config{{}, {Max: -1, Reserve: time.Hour}, {Max: 5 * time.Millisecond, Reserve: -1}, {Max: time.Second, Reserve: 999 * time.Millisecond}} {
		if _, err := deadline.New(cfg); err != nil {
			t.Errorf("New(%+v) = %v; want it valid", cfg, err)
		}
	}
}

func BenchmarkMiddleware(b *testing.B) {
	mw := mustNew(b, deadline.Config{}).Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set(deadline.HeaderTimeout, "1900")
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		mw.ServeHTTP(w, r)
	}
}
