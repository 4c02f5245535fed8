package shed_test

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/shed"
)

// Shedding keeps goodput under overload. In fake time, a pool of 10 slots ×
// 50 ms (capacity 200 rps) takes an open-loop 600 rps for 3 s from clients
// that give up after 1 s. Without shedding the queue grows until most
// requests time out and the ones served are served late; with a fixed limit
// of 30 or the adaptive one, the excess is refused at once with a 503, what
// is admitted is served within a few service times, and more than twice as
// many requests (1.5 times for the adaptive limit, which spends some of the
// run measuring) are answered in time. On real sockets the same shape
// measured:
//
//	no shedding   200=301 503=0 timeout=1499 p50_ok=567ms p99_ok=993ms
//	shed at 30    200=691 503=1109 timeout=0 p50_ok=150ms p99_ok=188ms
func TestSheddingKeepsGoodputUnderOverload(t *testing.T) {
	const (
		n       = 1800
		every   = time.Second / 600
		timeout = time.Second
		service = 50 * time.Millisecond
	)
	// newWrap runs inside the bubble, so that the shedder reads fake time.
	run := func(t *testing.T, newWrap func() func(http.Handler) http.Handler) (s summary) {
		synctest.Test(t, func(t *testing.T) {
			h := newWrap()(newPool(10, service).handler())
			s = summarize(openLoop(h, n, every, timeout, func(int) *http.Request { return get() }))
		})
		return s
	}
	none := run(t, func() func(http.Handler) http.Handler {
		return func(h http.Handler) http.Handler { return h }
	})
	var at30, auto *shed.Shedder
	fixed := run(t, func() func(http.Handler) http.Handler {
		// "in-flight >= 30": Normal traffic may fill the whole limit.
		at30 = mustNew(t, shed.Config{Limit: 30, Shares: map[shed.Priority]float64{shed.Normal: 1}})
		return at30.Middleware
	})
	adaptive := run(t, func() func(http.Handler) http.Handler {
		auto = mustNew(t, shed.Config{})
		return auto.Middleware
	})
	t.Logf("no shedding   %v", none)
	t.Logf("shed at 30    %v", fixed)
	t.Logf("adaptive      %v (limit %d, min RTT %v)", adaptive, auto.Stats().Limit, auto.Stats().MinRTT)

	if none.timeout < n/2 {
		t.Errorf("no shedding: %d timeouts, want most of %d requests", none.timeout, n)
	}
	for _, c := range []struct {
		name string
		s    summary
	}{{"shed at 30", fixed}, {"adaptive", adaptive}} {
		if c.s.timeout != 0 {
			t.Errorf("%s: %d timeouts, want 0", c.name, c.s.timeout)
		}
		if c.s.shedMax != 0 {
			t.Errorf("%s: slowest 503 took %v, want 0 (immediate)", c.name, c.s.shedMax)
		}
		if c.s.badRetryAfter != 0 {
			t.Errorf("%s: %d 503s without Retry-After: 1", c.name, c.s.badRetryAfter)
		}
		// The pool's service time is 50 ms; what is admitted waits at most
		// for the requests admitted before it.
		if c.s.p99 > 4*service {
			t.Errorf("%s: p99 of admitted = %v, want <= %v", c.name, c.s.p99, 4*service)
		}
		if c.s.ok+c.s.shed != n {
			t.Errorf("%s: %d answered, want %d", c.name, c.s.ok+c.s.shed, n)
		}
	}
	if fixed.ok <= 2*none.ok {
		t.Errorf("goodput shed at 30 = %d, want more than twice %d", fixed.ok, none.ok)
	}
	if adaptive.ok <= none.ok*3/2 {
		t.Errorf("goodput adaptive = %d, want more than 1.5 × %d", adaptive.ok, none.ok)
	}
	if st := at30.Stats(); st.Admitted != uint64(fixed.ok) || st.ShedByReason["capacity"] != uint64(fixed.shed) || st.InFlight != 0 {
		t.Errorf("stats %+v, want admitted %d, shed for capacity %d, nothing in flight", st, fixed.ok, fixed.shed)
	}
}
