package shed

import (
	"context"
	"slices"
	"time"
)

// waiter is a request waiting in the queue. Its fields after ready are set
// under Shedder.mu before ready is signalled.
type waiter struct {
	p     Priority
	retry bool
	since time.Time
	wait  time.Duration // the longest it may wait
	ready chan struct{} // buffered: the granter never blocks

	done bool   // granted or shed by the granter
	tok  Token  // when granted
	shed reason // when done without a token
}

// wait queues a request that found its share full. The caller holds s.mu;
// wait releases it.
//
// The queue follows CoDel as Facebook adapted it to request queues ("Fail at
// Scale", 2015): while the queue empties now and then it absorbs bursts, and a
// request may wait up to MaxQueueWait; once it has stayed non-empty for a
// whole QueueInterval it is standing, and a request may wait only
// QueueTarget, and those that already waited longer are shed, so that the
// free slots go to fresh requests and the queue drains. A queue that refills
// within an interval of standing is standing again at once.
func (s *Shedder) wait(ctx context.Context, p Priority, retry bool, now time.Time) (Token, error) {
	if len(s.queue) >= s.maxQueue {
		s.shed[p][reasonQueueFull]++
		inFlight, limit := s.inFlight, s.limitInt()
		s.mu.Unlock()
		return Token{}, s.rejected(ctx, p, reasonQueueFull, inFlight, limit)
	}
	w := &waiter{p: p, retry: retry, since: now, wait: s.maxWait, ready: make(chan struct{}, 1)}
	if len(s.queue) == 0 {
		s.busySince = now
		if !s.lastStanding.IsZero() && now.Sub(s.lastStanding) < s.interval {
			// Refilled soon after standing: it is the same overload (CoDel
			// resumes dropping in this case too).
			s.busySince = now.Add(-s.interval)
		}
	}
	s.queue = append(s.queue, w)
	if s.standingLocked(now) {
		w.wait = s.target
	}
	s.mu.Unlock()
	return s.await(ctx, w)
}

// standingLocked reports whether the queue has stayed non-empty for a whole
// interval, and remembers when it last was. The caller must hold s.mu.
func (s *Shedder) standingLocked(now time.Time) bool {
	if len(s.queue) > 0 && now.Sub(s.busySince) >= s.interval {
		s.lastStanding = now
		return true
	}
	return false
}

func (s *Shedder) await(ctx context.Context, w *waiter) (Token, error) {
	timer := time.NewTimer(w.wait) // ctx.Done covers the caller's deadline
	defer timer.Stop()
	var ctxErr error
	select {
	case <-w.ready:
	case <-timer.C:
	case <-ctx.Done():
		ctxErr = ctx.Err()
	}
	now := time.Now()
	s.mu.Lock()
	if !w.done {
		// Timed out or cancelled before the granter reached us.
		if i := slices.Index(s.queue, w); i >= 0 {
			s.queue = slices.Delete(s.queue, i, i+1)
		}
		w.done = true
		w.shed = reasonQueueTime
		if ctxErr != nil {
			w.shed = expiredReason(ctxErr)
		} else if err := ctx.Err(); err != nil {
			w.shed = expiredReason(err)
		}
		s.shed[w.p][w.shed]++
	} else if w.tok.s != nil && ctxErr != nil {
		// Granted after we gave up: put the slot back, as if never granted.
		s.admitted[w.p]--
		s.queuedAdmitted--
		s.queueTime -= now.Sub(w.since)
		s.inFlight--
		if w.retry {
			s.admittedRetries--
		}
		w.tok = Token{}
		w.shed = expiredReason(ctxErr)
		s.shed[w.p][w.shed]++
		if len(s.queue) > 0 {
			s.grantLocked(now)
		}
	}
	inFlight, limit := s.inFlight, s.limitInt()
	s.mu.Unlock()
	if w.tok.s == nil {
		return Token{}, s.rejected(ctx, w.p, w.shed, inFlight, limit)
	}
	s.admittedEvent(ctx, w.p, inFlight, limit, w.tok.start.Sub(w.since))
	return w.tok, nil
}

// grantLocked hands free slots to waiters: the highest priority first, in
// arrival order within a priority. While the queue is standing, waiters older
// than the target are shed instead. The caller must hold s.mu.
func (s *Shedder) grantLocked(now time.Time) {
	if s.standingLocked(now) {
		s.queue = slices.DeleteFunc(s.queue, func(w *waiter) bool {
			if now.Sub(w.since) <= s.target {
				return false
			}
			s.finishLocked(w, reasonQueueTime)
			return true
		})
	}
	for len(s.queue) > 0 {
		best, noBudget := -1, false
		for i, w := range s.queue {
			if best >= 0 && w.p <= s.queue[best].p {
				continue
			}
			if r, ok := s.decideLocked(w.p, w.retry); ok {
				best = i
			} else if r == reasonRetry {
				noBudget = true
			}
		}
		if noBudget {
			// The budget is empty: queued retries will not get in soon.
			s.queue = slices.DeleteFunc(s.queue, func(w *waiter) bool {
				if r, ok := s.decideLocked(w.p, w.retry); ok || r != reasonRetry {
					return false
				}
				s.finishLocked(w, reasonRetry)
				return true
			})
			continue
		}
		if best < 0 {
			break
		}
		w := s.queue[best]
		s.queue = slices.Delete(s.queue, best, best+1)
		sojourn := now.Sub(w.since)
		w.tok = s.commitLocked(w.p, w.retry, now)
		w.tok.start = now // the latency sample starts at admission
		w.done = true
		s.queuedAdmitted++
		s.queueTime += sojourn
		w.ready <- struct{}{}
	}
}

// finishLocked sheds a waiter from the granter's side. The caller must hold
// s.mu and remove w from the queue.
func (s *Shedder) finishLocked(w *waiter, r reason) {
	w.done = true
	w.shed = r
	s.shed[w.p][r]++
	w.ready <- struct{}{}
}
