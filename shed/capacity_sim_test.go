package shed

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// capacityRun is one run of the changing-capacity workload.
type capacityRun struct {
	phases  []int // slots per phase
	phase   time.Duration
	service time.Duration
	timeout time.Duration
	rps     float64
}

type simShot struct {
	sent time.Duration
	took time.Duration
	ok   bool
}

type phaseResult struct {
	slots       int
	goodputPct  float64 // 200s within the timeout / the phase's capacity
	p99         time.Duration
	convergence time.Duration // after the change into this phase; -1 if never
	limitEnd    int
}

// simulate runs the workload in a synctest bubble against s (nil: no
// shedding) and returns each phase's result, attributing a request to the
// phase in which it was sent.
func (c capacityRun) simulate(t *testing.T, newShedder func() *Shedder) []phaseResult {
	t.Helper()
	var out []phaseResult
	synctest.Test(t, func(t *testing.T) {
		s := newShedder()
		pool := newTestPool(c.phases[0])
		total := c.phase * time.Duration(len(c.phases))
		n := int(c.rps * total.Seconds())
		shots := make([]simShot, n)
		limits := make([]int, len(c.phases))
		start := time.Now()
		var wg sync.WaitGroup
		if s != nil && simTrace {
			wg.Go(func() {
				var b []byte
				for k := 0; time.Since(start) < total; k++ {
					in, l := s.Load()
					b = fmt.Appendf(b, "%d/%d ", in, l)
					if k%10 == 9 {
						b = append(b, '|')
					}
					time.Sleep(50 * time.Millisecond)
				}
				t.Logf("trace (in/limit every 50ms): %s", b)
			})
		}
		wg.Go(func() {
			for i := 1; i < len(c.phases); i++ {
				time.Sleep(time.Until(start.Add(time.Duration(i) * c.phase)))
				if s != nil {
					_, limits[i-1] = s.Load()
				}
				pool.Resize(c.phases[i])
			}
		})
		interval := float64(time.Second) / c.rps
		for i := range n {
			due := time.Duration(float64(i) * interval)
			time.Sleep(time.Until(start.Add(due)))
			wg.Go(func() {
				o := &shots[i]
				o.sent = due
				ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
				defer cancel()
				t0 := time.Now()
				var tok Token
				if s != nil {
					var err error
					if tok, err = s.Acquire(ctx, Critical); err != nil {
						return
					}
				}
				if pool.Acquire(ctx) != nil {
					tok.Ignore()
					return
				}
				time.Sleep(c.service)
				pool.Release()
				o.took = time.Since(t0)
				if ctx.Err() != nil {
					tok.Ignore()
					return
				}
				tok.Release()
				o.ok = true
			})
		}
		wg.Wait()
		if s != nil {
			_, limits[len(c.phases)-1] = s.Load()
		}
		out = c.judge(shots, limits)
	})
	return out
}

// judge computes each phase's goodput, p99 and time to converge.
func (c capacityRun) judge(shots []simShot, limits []int) []phaseResult {
	const bucket = 100 * time.Millisecond
	res := make([]phaseResult, len(c.phases))
	for k, slots := range c.phases {
		from, to := time.Duration(k)*c.phase, time.Duration(k+1)*c.phase
		var lat []time.Duration
		nb := int(c.phase / bucket)
		byDone := make([]float64, nb)
		for _, o := range shots {
			if done := o.sent + o.took; o.ok && done >= from && done < to {
				lat = append(lat, o.took)
				byDone[int((done-from)/bucket)]++
			}
		}
		capacity := float64(slots) / c.service.Seconds()
		r := phaseResult{slots: slots, limitEnd: limits[k]}
		r.goodputPct = 100 * float64(len(lat)) / c.phase.Seconds() / capacity
		if len(lat) > 0 {
			slices.Sort(lat)
			r.p99 = lat[int(math.Ceil(0.99*float64(len(lat))))-1]
		}
		steady := slices.Clone(byDone[nb/2:])
		slices.Sort(steady)
		med := steady[len(steady)/2]
		r.convergence = -1
		for b := range nb {
			if math.Abs(byDone[b]-med) <= 0.05*med {
				r.convergence = time.Duration(b) * bucket
				break
			}
		}
		res[k] = r
	}
	return res
}

func (r phaseResult) String() string {
	return fmt.Sprintf("slots %2d: goodput %5.1f%% p99 %4dms converge %4dms limit %d",
		r.slots, r.goodputPct, r.p99.Milliseconds(), r.convergence.Milliseconds(), r.limitEnd)
}

var simTrace = os.Getenv("SHED_SIM_TRACE") != ""

// The adaptive limit follows a pool that goes from 10 slots to 5 and then
// 20, at 3x and 30x overload, on a fake clock: every phase keeps its
// goodput, answers in time and converges within a second, and the limit
// ends each phase near the pool's size. No fixed limit does all of that.
func TestAdaptiveFollowsCapacity(t *testing.T) {
	const service = 50 * time.Millisecond
	for _, over := range []float64{3, 30} {
		c := capacityRun{phases: []int{10, 5, 20}, phase: 3 * time.Second, service: service, timeout: time.Second, rps: 200 * over}
		res := c.simulate(t, func() *Shedder { s, _ := New(Config{}); return s })
		for k, r := range res {
			t.Logf("%2.0fx adaptive %v", over, r)
			if r.goodputPct < 95 {
				t.Errorf("%.0fx phase %d: goodput %.1f%% of capacity, want >= 95%%", over, k+1, r.goodputPct)
			}
			// Phase 2 inherits the queue of a pool twice its size: the
			// requests admitted before the change drain at half speed.
			maxP99 := 2 * service
			if k == 1 {
				maxP99 = 3 * service
			}
			if r.p99 > maxP99 {
				t.Errorf("%.0fx phase %d: p99 %v, want <= %v", over, k+1, r.p99, maxP99)
			}
			if r.convergence < 0 || r.convergence > time.Second {
				t.Errorf("%.0fx phase %d: converged after %v, want <= 1s", over, k+1, r.convergence)
			}
			if lo, hi := r.slots+1, r.slots*3/2+2; r.limitEnd < lo || r.limitEnd > hi {
				t.Errorf("%.0fx phase %d: limit %d at the end, want %d..%d for %d slots", over, k+1, r.limitEnd, lo, hi, r.slots)
			}
		}
		for _, limit := range []int{10, 30, 60} {
			res := c.simulate(t, func() *Shedder {
				s, _ := New(Config{Limit: limit, Shares: map[Priority]float64{Critical: 1}})
				return s
			})
			good := true
			for k, r := range res {
				t.Logf("%2.0fx fixed %d %v", over, limit, r)
				if r.goodputPct < 95 || r.p99 > 2*service && k != 1 || r.p99 > 3*service {
					good = false
				}
			}
			if good {
				t.Errorf("%.0fx: a fixed limit of %d met every target: the workload does not tell limits apart", over, limit)
			}
		}
	}
}
