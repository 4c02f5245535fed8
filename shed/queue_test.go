package shed_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/shed"
)

// queued is what one Acquire with a queue did.
type queued struct {
	admitted bool
	wait     time.Duration // until admitted or shed
	reason   string
}

// hold acquires, and when admitted holds the slot for d before releasing.
func hold(s *shed.Shedder, d time.Duration) queued {
	t0 := time.Now()
	tok, err := s.Acquire(context.Background(), shed.Normal)
	q := queued{admitted: err == nil, wait: time.Since(t0)}
	if err != nil {
		q.reason = err.(*shed.Error).Reason
		return q
	}
	time.Sleep(d)
	tok.Release()
	return q
}

func queueConfig() shed.Config {
	// 10 slots, a queue of 100, CoDel's defaults: target 5 ms, interval
	// 100 ms, waits of at most 100 ms.
	return shed.Config{Limit: 10, Shares: map[shed.Priority]float64{shed.Normal: 1}, MaxQueue: 100}
}

func TestQueueAbsorbsShortBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mustNew(t, queueConfig())
		out := make([]queued, 20)
		var wg sync.WaitGroup
		for i := range out { // 20 at once for 10 slots of 50 ms
			wg.Go(func() { out[i] = hold(s, 50*time.Millisecond) })
		}
		wg.Wait()
		var waited int
		for i, q := range out {
			if !q.admitted {
				t.Errorf("request %d shed (%s) after %v", i, q.reason, q.wait)
			}
			if q.wait > 0 {
				waited++
				if q.wait != 50*time.Millisecond {
					t.Errorf("request %d waited %v, want 50ms", i, q.wait)
				}
			}
		}
		st := s.Stats()
		if waited != 10 || st.QueuedAdmitted != 10 || st.QueueTime != 500*time.Millisecond || st.Queued != 0 {
			t.Errorf("%d waited; stats %+v; want 10 queued for 50ms each", waited, st)
		}
	})
}

func TestQueueShedsStandingQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mustNew(t, queueConfig())
		// 400 rps for 2 s on a capacity of about 200 rps (service times of
		// 25..75 ms): a queue that would stand.
		const n = 800
		out := make([]queued, n)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range out {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / 400)))
			wg.Go(func() { out[i] = hold(s, time.Duration(25+i*37%51)*time.Millisecond) })
		}
		wg.Wait()
		// The first interval is a burst and is absorbed; count from 200 ms.
		var admitted, shedFast, shedSlow int
		var maxWait, sumWait time.Duration
		for _, q := range out[80:] {
			switch {
			case q.admitted:
				admitted++
				sumWait += q.wait
				maxWait = max(maxWait, q.wait)
			case q.wait <= 5*time.Millisecond:
				shedFast++
			default:
				shedSlow++
			}
		}
		st := s.Stats()
		t.Logf("from 200 ms: admitted %d (mean wait %v, max %v), shed within the 5 ms target %d, later %d; %v",
			admitted, sumWait/time.Duration(admitted), maxWait, shedFast, shedSlow, st.ShedByReason)
		if mean := sumWait / time.Duration(admitted); mean > 5*time.Millisecond {
			t.Errorf("mean wait %v, want <= 5ms: the queue stood", mean)
		}
		if shedSlow*20 > shedFast {
			t.Errorf("%d shed after more than the target, %d within: want 95 %% within", shedSlow, shedFast)
		}
		if admitted < 340 { // capacity: about 200 rps for 1.8 s
			t.Errorf("admitted %d, want the backend kept busy (>= 340)", admitted)
		}
		if st.Queued != 0 || st.InFlight != 0 {
			t.Errorf("stats %+v, want nothing left", st)
		}
	})
}

func TestQueueWaitRespectsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mustNew(t, queueConfig())
		toks, _ := fill(t, s, shed.Normal, false) // queue: fill returns at the first refusal, which waits 100 ms
		defer releaseAll(toks)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		_, err := s.Acquire(ctx, shed.Normal)
		if !isReason(err, event.ReasonExpired) || time.Since(t0) != 30*time.Millisecond {
			t.Errorf("err %v after %v, want expired after 30ms", err, time.Since(t0))
		}
		if st := s.Stats(); st.Queued != 0 || st.InFlight != 10 {
			t.Errorf("stats %+v, want nothing queued, 10 in flight", st)
		}
	})
}
