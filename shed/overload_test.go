package shed_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/shed"
)

// The three-times overload of TestSheddingKeepsGoodput with a mix of
// priorities: critical keeps >= 95 % success while sheddable absorbs the
// rejections.
func TestPrioritiesUnderOverload(t *testing.T) {
	mix := [10]shed.Priority{
		shed.Critical, shed.High, shed.Normal, shed.Normal, shed.Normal,
		shed.Low, shed.Low, shed.Sheddable, shed.Sheddable, shed.Sheddable,
	}
	for _, c := range []struct {
		name string
		cfg  shed.Config
		skip int // requests sent while the limit warms up, not counted
	}{
		{"fixed 30", shed.Config{Limit: 30}, 0},
		// The adaptive limit's first min-RTT probe holds it at 3 for its
		// first 10 requests (about 0.2 s here), then it converges: count
		// from 1 s on.
		{"adaptive", shed.Config{}, 600},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c.cfg.MaxHeaderPriority = shed.Critical // this server trusts its callers
				h := mustNew(t, c.cfg).Middleware(newPool(10, 50*time.Millisecond).handler())
				out := openLoop(h, 1800, time.Second/600, time.Second, func(i int) *http.Request {
					return get(shed.HeaderPriority, mix[i%10].String())
				})
				ok, total := map[shed.Priority]int{}, map[shed.Priority]int{}
				for _, o := range out[c.skip:] {
					p := shed.HeaderPriorityOf(o.req.Header, shed.Critical)
					total[p]++
					if o.code == http.StatusOK {
						ok[p]++
					}
				}
				rate := func(p shed.Priority) float64 { return float64(ok[p]) / float64(total[p]) }
				var b strings.Builder
				for p := shed.Critical; p >= shed.Sheddable; p-- {
					fmt.Fprintf(&b, " %s=%d/%d", p, ok[p], total[p])
				}
				t.Logf("%s: success%s", c.name, b.String())
				if r := rate(shed.Critical); r < 0.95 {
					t.Errorf("critical success %.3f, want >= 0.95", r)
				}
				for p := shed.Critical; p > shed.Sheddable; p-- {
					if rate(p-1) > rate(p) {
						t.Errorf("%v succeeds more (%.2f) than %v (%.2f)", p-1, rate(p-1), p, rate(p))
					}
				}
				if r := rate(shed.Sheddable); r > 0.1 {
					t.Errorf("sheddable success %.2f, want <= 0.1: it absorbs the rejections", r)
				}
			})
		})
	}
}

// A third of the three-times overload are retries: they are shed before the
// originals, and the retries admitted stay under RetryRatio (0.1) of the
// originals admitted. Retries claiming Normal are judged as Low under
// pressure and lose on capacity; retries claiming High (judged as Normal)
// compete with the originals and are held by the budget.
func TestRetriesShedBeforeOriginals(t *testing.T) {
	for _, retryPriority := range []shed.Priority{shed.Normal, shed.High} {
		t.Run("retries "+retryPriority.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := mustNew(t, shed.Config{Limit: 30, MaxHeaderPriority: shed.Critical})
				h := s.Middleware(newPool(10, 50*time.Millisecond).handler())
				out := openLoop(h, 1800, time.Second/600, time.Second, func(i int) *http.Request {
					if i%3 == 0 {
						return get(deadline.HeaderRetryAttempt, "1", shed.HeaderPriority, retryPriority.String())
					}
					return get()
				})
				var okRetry, retries, okOrig, orig int
				for _, o := range out {
					if o.req.Header.Get(deadline.HeaderRetryAttempt) != "" {
						retries++
						if o.code == http.StatusOK {
							okRetry++
						}
					} else {
						orig++
						if o.code == http.StatusOK {
							okOrig++
						}
					}
				}
				st := s.Stats()
				share := float64(st.AdmittedRetries) / float64(st.Admitted-st.AdmittedRetries)
				t.Logf("originals %d/%d admitted, retries %d/%d; admitted retries/originals = %.3f; shed %v",
					okOrig, orig, okRetry, retries, share, st.ShedByReason)
				if okRetry*orig >= okOrig*retries {
					t.Errorf("retry success %d/%d not below original success %d/%d", okRetry, retries, okOrig, orig)
				}
				// 0.1 per original, plus the initial burst of 10 tokens and the
				// retries admitted before the server was under pressure.
				if limit := 0.1 + 25.0/float64(okOrig); share > limit {
					t.Errorf("admitted retries are %.3f of originals, want <= %.3f", share, limit)
				}
				if retryPriority == shed.High && st.ShedByReason[event.ReasonRetryRatio] == 0 {
					t.Errorf("no retry shed by the budget: %v", st.ShedByReason)
				}
			})
		})
	}
}

// drive sends open-loop Acquire calls at rate per second for d to a backend
// of 10 slots whose service time is service(now), and calls each(elapsed)
// every 100 ms.
func drive(s *shed.Shedder, rate int, d time.Duration, service func() time.Duration, each func(time.Duration)) {
	sem := make(chan struct{}, 10)
	var wg sync.WaitGroup
	start := time.Now()
	every := time.Second / time.Duration(rate)
	next := 100 * time.Millisecond
	for i := 0; time.Duration(i)*every < d; i++ {
		at := time.Duration(i) * every
		time.Sleep(time.Until(start.Add(at)))
		if at >= next {
			each(at)
			next += 100 * time.Millisecond
		}
		tok, err := s.Acquire(context.Background(), shed.Normal)
		if err != nil {
			continue
		}
		st := service()
		wg.Go(func() {
			sem <- struct{}{}
			time.Sleep(st)
			<-sem
			tok.Release()
		})
	}
	wg.Wait()
}

// With no configuration but the start, the adaptive limit converges near
// the backend's real concurrency (10) from far below and far above it.
func TestAdaptiveLimitConverges(t *testing.T) {
	for _, initial := range []int{1, 200} {
		t.Run(fmt.Sprint("from ", initial), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := mustNew(t, shed.Config{Adaptive: shed.Adaptive{InitialLimit: initial, MinLimit: 1}})
				var trace []string
				lo, hi := 1<<30, 0
				drive(s, 600, 10*time.Second, func() time.Duration { return 50 * time.Millisecond }, func(at time.Duration) {
					l := s.Stats().Limit
					trace = append(trace, fmt.Sprint(l))
					if at >= 7*time.Second {
						lo, hi = min(lo, l), max(hi, l)
					}
				})
				st := s.Stats()
				t.Logf("limit by second %v; from 7 s on: %d..%d; min RTT %v", trace, lo, hi, st.MinRTT)
				if lo < 10 || hi > 20 {
					t.Errorf("limit from 7 s on in %d..%d, want within 10..20", lo, hi)
				}
				if st.MinRTT != 50*time.Millisecond {
					t.Errorf("min RTT %v, want 50ms", st.MinRTT)
				}
			})
		})
	}
}

// The backend's service time doubles; the periodic min-RTT probe notices and
// the limit stays near the real concurrency.
func TestAdaptiveLimitFollowsSlowerBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mustNew(t, shed.Config{})
		start := time.Now()
		service := func() time.Duration {
			if time.Since(start) > 20*time.Second {
				return 100 * time.Millisecond
			}
			return 50 * time.Millisecond
		}
		lo, hi := 1<<30, 0
		drive(s, 300, 90*time.Second, service, func(at time.Duration) {
			if at >= 80*time.Second {
				l := s.Stats().Limit
				lo, hi = min(lo, l), max(hi, l)
			}
		})
		st := s.Stats()
		t.Logf("after 90 s: limit %d..%d over the last 10 s, min RTT %v", lo, hi, st.MinRTT)
		if st.MinRTT < 100*time.Millisecond || st.MinRTT > 130*time.Millisecond {
			t.Errorf("min RTT %v, want about 100ms", st.MinRTT)
		}
		if lo < 10 || hi > 20 {
			t.Errorf("limit %d..%d, want within 10..20", lo, hi)
		}
	})
}
