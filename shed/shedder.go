package shed

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/event"
)

// Config configures a Shedder. The zero value is safe and useful: an adaptive
// limit, the default priority shares, a retry ratio of 0.1, no queue, and
// 503 with Retry-After: 1 from the middleware. A zero field means its
// default; a negative value is invalid except in RetryRatio, where it means
// no limit; New reports an invalid field by name. New copies what it needs,
// so changing a Config after New has no effect.
type Config struct {
	// Name labels the shedder's events (Event.Dependency), for example the
	// service or route group it protects. May be empty.
	Name string

	// Limit fixes the concurrency limit: the most requests in flight at
	// once, reached only by the priorities whose share is 1 (Critical by
	// default). Zero means adaptive (see Adaptive); use a fixed limit only
	// when the capacity is known and stable. Negative is invalid.
	Limit int
	// Adaptive tunes the adaptive limit when Limit is zero. Its zero value is
	// the recommended configuration.
	Adaptive Adaptive

	// Shares maps a priority to the share of the limit that its requests may
	// fill, in (0, 1]: a request is admitted only while in-flight < limit ×
	// share, so the limit is never exceeded. A missing or zero entry means
	// the default: sheddable 50 %, low 70 %, normal 85 %, high 95 %,
	// critical 100 %. Analytics is refused when the server is half full;
	// checkout keeps the last 5 % to itself. A fixed Limit of N therefore
	// admits 0.85×N Normal requests; set Shares[Normal] = 1 to admit N.
	// Keys must be Sheddable..Critical.
	Shares map[Priority]float64

	// RetryRatio caps retries admitted under pressure at this many per
	// original request admitted: a receiver-side retry budget, a token
	// bucket that each admitted original fills by RetryRatio and each retry
	// admitted under pressure drains by 1. Zero means 0.1. A negative value
	// means no limit: retries are treated as originals.
	RetryRatio float64
	// RetryBurst is the budget's capacity in tokens (it starts full),
	// zero or more. Zero means 10.
	RetryBurst float64
	// RetryPressure is the utilisation (in-flight / limit) from which the
	// server is under pressure: retries then need a budget token and are
	// judged one priority lower than they claim, so they are shed before
	// originals. Below it, retries are admitted like originals. It is in
	// (0, 1]; zero means 0.5.
	RetryPressure float64

	// MaxQueue is how many requests may wait for a slot when their priority's
	// share is full; beyond, they are shed (ReasonQueueFull). Zero means
	// none: a request is rejected before queueing, which is the right
	// default for a server whose callers have timeouts.
	MaxQueue int
	// QueueInterval is how long the queue must stay non-empty to count as
	// standing rather than a burst. Zero means 100 ms.
	QueueInterval time.Duration
	// MaxQueueWait is the longest a request waits in a queue that is not
	// standing, never past its context's deadline. Zero means QueueInterval.
	MaxQueueWait time.Duration
	// QueueTarget is the longest a request waits in a standing queue; the
	// waiters older than this are shed (ReasonQueueTime) so that slots go to
	// fresh requests. Zero means 5 ms.
	QueueTarget time.Duration

	// RetryAfter is the delay the middleware puts in Retry-After on a 503,
	// rounded up to whole seconds. Zero means 1 s.
	RetryAfter time.Duration
	// Priority returns a request's priority for the middleware (by route,
	// by authenticated client...). It is trusted. Nil means the
	// X-Request-Priority header, capped at MaxHeaderPriority; a request
	// without a valid header is Normal.
	Priority func(*http.Request) Priority
	// MaxHeaderPriority is the highest priority a client may claim with the
	// X-Request-Priority header, so that no client can escalate itself past
	// what the server allows. Zero means Normal: by default the header can
	// only lower a request's priority. Ignored when Priority is set.
	MaxHeaderPriority Priority
	// IsRetry reports whether a request is a retry, for the middleware. Nil
	// means an X-Retry-Attempt header with a number above 0.
	IsRetry func(*http.Request) bool

	// Observer receives event.Admit and event.Shed. Nil means none.
	Observer event.Observer

	// ByCohort makes the Shedder refuse by cohort first (package chain):
	// it keeps an admission level and refuses at once the requests whose
	// cohort is below it (reason event.ReasonCohort). Every 100 ms the
	// level rises in proportion to the share of the requests above it that
	// were refused for capacity past 5 % (the bursts no level prevents),
	// and falls by a tenth after 100 ms without such a refusal. Every tier
	// of a chain that does the same, and whose
	// chain.Server refuses at its door below the level of the tiers it
	// calls, refuses the same requests, so that no tier works for a
	// request another will refuse. Requests without a cohort are admitted
	// or refused for capacity as without it. The level is
	// AdmissionLevel.
	ByCohort bool
}

// Wire headers read by the middleware's defaults.
const (
	// HeaderPriority carries a request's priority by name: "critical",
	// "high", "normal", "low" or "sheddable" (ASCII case ignored).
	HeaderPriority = "X-Request-Priority"
)

// defaultShares is the share of the limit each priority may fill when
// Config.Shares has no entry for it.
var defaultShares = [numPriorities]float64{
	Sheddable: 0.50,
	Low:       0.70,
	Normal:    0.85,
	High:      0.95,
	Critical:  1.00,
}

// Shedder admits or refuses requests so that a server under overload keeps
// serving the ones it admits within their deadline, instead of serving all of
// them late: under three times its capacity, a server that refuses 60 % of
// the requests at once answers more than twice as many in time as one that
// queues them all until their callers give up.
//
// A request is admitted while the number in flight is below the limit times
// its priority's share (see Config.Shares): lower priorities are refused at
// lower utilisation. Under pressure, retries are judged one priority lower
// and drain a token bucket fed by admitted originals, so retries are shed
// before originals and stay a bounded share of the work. By default there
// is no queue: a request that cannot be admitted is refused at once, which
// costs microseconds, where one that waits until its caller's timeout costs a
// connection, memory and thrown-away work. An optional CoDel-style queue
// absorbs short bursts but does not let a queue stand (see Config.MaxQueue).
// The limit is fixed or adaptive (see Adaptive).
//
// Acquire is the transport-neutral API; Middleware wraps an http.Handler.
// Admission and rejection allocate nothing. A Shedder is safe for concurrent
// use by multiple goroutines.
type Shedder struct {
	name       string
	obs        event.Observer
	share      [numPriorities]float64
	retryAware bool
	retryRatio float64
	retryBurst float64
	pressure   float64
	maxQueue   int
	target     time.Duration
	interval   time.Duration
	maxWait    time.Duration
	retryAfter []string
	relief     atomic.Pointer[relief] // while relieved with a Retry-After of its own
	priorityFn func(*http.Request) Priority
	maxHeader  Priority
	isRetryFn  func(*http.Request) bool
	byCohort   bool
	level      atomic.Int32 // the admission level; written under mu

	mu sync.Mutex // guards everything below
	// The admission level's window: its start (unix nanoseconds) and the
	// requests at or above the level it refused for capacity and admitted.
	winStart                int64
	winRefused, winAdmitted int
	// limit is the limit in force: the fixed one, or ctl.effective(),
	// at most ceiling while relieved.
	limit    float64
	fixed    float64     // the fixed limit; 0 for an adaptive one
	ceiling  float64     // while relieved (Relieve): the cut limit; 0 otherwise
	ctl      *controller // nil for a fixed limit
	inFlight int
	tokens   float64 // retry budget
	queue    []*waiter
	// busySince is when the queue last became non-empty (moved back by an
	// interval when it refills soon after standing); lastStanding is when it
	// was last seen standing.
	busySince, lastStanding time.Time

	admitted        [numPriorities]uint64
	admittedRetries uint64
	shed            [numPriorities][numReasons]uint64
	queuedAdmitted  uint64
	queueTime       time.Duration
}

// New returns a Shedder configured by c, or an error that Is
// ErrInvalidConfig and names every field of c that is invalid.
func New(c Config) (*Shedder, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	s := &Shedder{
		name:       c.Name,
		obs:        c.Observer,
		retryAware: c.RetryRatio >= 0,
		retryRatio: c.RetryRatio,
		retryBurst: c.RetryBurst,
		pressure:   c.RetryPressure,
		maxQueue:   c.MaxQueue,
		target:     orDur(c.QueueTarget, 5*time.Millisecond),
		interval:   orDur(c.QueueInterval, 100*time.Millisecond),
		priorityFn: c.Priority,
		maxHeader:  c.MaxHeaderPriority.normalize(),
		isRetryFn:  c.IsRetry,
		byCohort:   c.ByCohort,
	}
	s.maxWait = orDur(c.MaxQueueWait, s.interval)
	if s.retryRatio == 0 {
		s.retryRatio = 0.1
	}
	if s.retryBurst == 0 {
		s.retryBurst = 10
	}
	s.tokens = s.retryBurst
	if s.pressure == 0 {
		s.pressure = 0.5
	}
	for p := Sheddable; p <= Critical; p++ {
		v := c.Shares[p]
		if v == 0 {
			v = defaultShares[p]
		}
		s.share[p] = v
	}
	s.retryAfter = []string{strconv.FormatInt(ceilSeconds(orDur(c.RetryAfter, time.Second)), 10)}
	if c.Limit > 0 {
		s.limit = float64(c.Limit)
		s.fixed = s.limit
	} else {
		s.ctl = newController(c.Adaptive, s.share[Normal], time.Now())
		s.limit = s.ctl.effective()
	}
	return s, nil
}

// Token is an admitted request's slot. Call Release (or Ignore) exactly once
// when the request is done; the zero Token's methods do nothing. A Token is a
// value: copying it does not copy the slot. It may be released from any
// goroutine.
type Token struct {
	s     *Shedder
	start time.Time // admission time, when read (a queue or a timed request)
	gen   uint32
	in    int32 // in flight at admission, itself included, when timed
	timed bool  // the adaptive limit takes this request's latency
}

// Release frees the slot and, with an adaptive limit, feeds the request's
// latency since admission to it.
func (t Token) Release() {
	if t.s != nil {
		t.s.release(t, true)
	}
}

// Ignore frees the slot without feeding the latency to the adaptive limit:
// use it when the request ended for a reason that says nothing about load,
// such as the client going away or a request rejected as invalid.
func (t Token) Ignore() {
	if t.s != nil {
		t.s.release(t, false)
	}
}

// Acquire admits an original request of priority p, or refuses it with an
// *Error that Is ErrShed. With a queue (Config.MaxQueue) it may
// wait, never past ctx's deadline; without one it never blocks. A request
// whose ctx is already done is refused with ReasonExpired.
func (s *Shedder) Acquire(ctx context.Context, p Priority) (Token, error) {
	return s.acquire(ctx, p, false)
}

// AcquireRetry is Acquire for a retry: a request the caller has sent before.
// Under pressure, retries are shed before originals and kept under
// Config.RetryRatio of them.
func (s *Shedder) AcquireRetry(ctx context.Context, p Priority) (Token, error) {
	return s.acquire(ctx, p, true)
}

func (s *Shedder) acquire(ctx context.Context, p Priority, retry bool) (Token, error) {
	p = p.normalize()
	if err := ctx.Err(); err != nil {
		r := expiredReason(err)
		s.mu.Lock()
		s.shed[p][r]++
		inFlight, limit := s.inFlight, s.limitInt()
		s.mu.Unlock()
		return Token{}, s.rejected(ctx, p, r, inFlight, limit)
	}
	var now time.Time
	if s.maxQueue > 0 {
		now = time.Now() // read once: latency start, queue arrival
	}
	cohort := -1
	if s.byCohort {
		if c, ok := chain.FromContext(ctx).Cohort(); ok {
			cohort = c
		}
	}
	s.mu.Lock()
	if cohort >= 0 && cohort < int(s.level.Load()) {
		s.shed[p][reasonCohort]++
		inFlight, limit := s.inFlight, s.limitInt()
		s.mu.Unlock()
		return Token{}, s.rejected(ctx, p, reasonCohort, inFlight, limit)
	}
	r, ok := s.decideLocked(p, retry)
	if ok {
		tok := s.commitLocked(p, retry, now)
		if cohort >= 0 {
			s.noteCohortLocked(false)
		}
		inFlight, limit := s.inFlight, s.limitInt()
		s.mu.Unlock()
		s.admittedEvent(ctx, p, inFlight, limit, 0)
		return tok, nil
	}
	if r == reasonCapacity && cohort >= 0 {
		// Refusing a cohort at or above the level: the level may be too
		// low for the load.
		s.noteCohortLocked(true)
	}
	if r == reasonCapacity {
		if s.ctl != nil {
			s.ctl.refused()
		}
		if s.maxQueue > 0 && s.ceiling == 0 {
			return s.wait(ctx, p, retry, now) // unlocks
		}
	}
	s.shed[p][r]++
	inFlight, limit := s.inFlight, s.limitInt()
	s.mu.Unlock()
	return Token{}, s.rejected(ctx, p, r, inFlight, limit)
}

// decideLocked reports whether a request may be admitted now, or why not. It
// changes nothing. The caller must hold s.mu.
func (s *Shedder) decideLocked(p Priority, retry bool) (reason, bool) {
	in := float64(s.inFlight)
	if retry && s.retryAware && in >= s.pressure*s.limit {
		if s.tokens < 1 {
			return reasonRetry, false
		}
		if p > Sheddable {
			p--
		}
	}
	if in >= s.limit*s.share[p] {
		return reasonCapacity, false
	}
	return 0, true
}

// commitLocked admits a request decideLocked allowed. The caller must hold
// s.mu.
func (s *Shedder) commitLocked(p Priority, retry bool, now time.Time) Token {
	if retry {
		if s.retryAware && float64(s.inFlight) >= s.pressure*s.limit {
			s.tokens--
		}
		s.admittedRetries++
	} else if s.retryAware {
		s.tokens = min(s.retryBurst, s.tokens+s.retryRatio)
	}
	s.inFlight++
	s.admitted[p]++
	tok := Token{s: s}
	tok.start = now
	if s.ctl != nil {
		s.ctl.admitted(s.inFlight)
		if s.ctl.sampleNext() {
			if now.IsZero() {
				now = time.Now()
			}
			tok.start, tok.gen, tok.in, tok.timed = now, s.ctl.gen, int32(s.inFlight), true
		}
	}
	return tok
}

func (s *Shedder) release(t Token, sample bool) {
	timed := s.ctl != nil && sample && t.timed
	var now time.Time
	if timed || s.maxQueue > 0 {
		now = time.Now()
	}
	s.mu.Lock()
	s.inFlight--
	if s.ctl != nil && sample {
		s.ctl.completed()
	}
	if timed && s.ctl.observe(now, now.Sub(t.start), t.gen, int(t.in), s.inFlight) {
		s.limit = s.cappedLocked(s.ctl.effective())
	}
	if len(s.queue) > 0 {
		s.grantLocked(now)
	}
	s.mu.Unlock()
}

// levelWindow is how often the admission level moves: it is set from the
// refusals and admissions of the cohorts at or above it over one window.
const levelWindow = 100 * time.Millisecond

// levelTarget is the share of the requests at or above the admission
// level that the Shedder may still refuse for capacity over a window
// without raising the level: the bursts that no level prevents.
const levelTarget = 0.05

// noteCohortLocked counts a request of a cohort at or above the admission
// level, admitted or refused for capacity, and at the end of each
// levelWindow moves the level: up in proportion to the share refused past
// levelTarget (half of the cohorts it says are too many, so that it
// settles rather than overshoots), down by a tenth (at least one) when none
// was refused. The caller holds s.mu.
func (s *Shedder) noteCohortLocked(refused bool) {
	if refused {
		s.winRefused++
	} else {
		s.winAdmitted++
	}
	now := time.Now().UnixNano()
	if s.winStart == 0 {
		s.winStart = now
	}
	if now-s.winStart < int64(levelWindow) {
		return
	}
	level := int(s.level.Load())
	total := s.winRefused + s.winAdmitted
	switch share := float64(s.winRefused) / float64(total); {
	case share > levelTarget:
		up := int(math.Ceil(0.5 * (share - levelTarget) * float64(chain.Cohorts-level)))
		level = min(level+up, chain.Cohorts-1)
	case s.winRefused == 0 && level > 0:
		// A tenth at a time: back from the top within a few seconds
		// once the overload is over.
		level -= max(1, level/10)
	}
	s.level.Store(int32(level))
	s.winStart, s.winRefused, s.winAdmitted = now, 0, 0
}

// AdmissionLevel returns the lowest cohort the Shedder admits now (see
// Config.ByCohort): 0 admits every one. It is what a chain.Server in front
// of it refuses at its door (chain.Config.Admission) and tells its callers.
func (s *Shedder) AdmissionLevel() int { return int(s.level.Load()) }

// Relieve cuts the Shedder's load while the system behind it cannot
// recover under it, and gives it back in steps: a metastability
// detector's actuator (package metastable) calls it. It reports whether
// the Shedder is relieved when it returns.
//
// With keep in (0, 1), the limit in force is cut to keep of what it is now
// (at least 1), nothing queues, the requests queued now are refused, and
// refusals answer Retry-After retryAfter (rounded up to a second; zero
// keeps Config.RetryAfter). Called again, it cuts again from the limit in
// force.
//
// With keep above 1, a relieved Shedder's cut limit grows by that factor;
// once it reaches the limit the Shedder would have without the relief,
// the relief ends. Relieve(0, 0) ends it at once. When it ends, a fixed
// limit is back whole; an adaptive one goes on from where it was cut, at
// its own pace, as after any overload. Any other keep changes nothing.
func (s *Shedder) Relieve(keep float64, retryAfter time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case keep == 0:
		s.endReliefLocked()
		return false
	case keep > 1 && !math.IsInf(keep, 1):
		if s.ceiling == 0 {
			return false
		}
		s.ceiling *= keep
		if s.ceiling >= s.uncappedLocked() {
			s.endReliefLocked()
			return false
		}
		s.limit = s.cappedLocked(s.uncappedLocked())
		return true // nothing queues while relieved: no waiter to grant
	case !(keep > 0 && keep < 1):
		return s.ceiling > 0
	}
	s.ceiling = max(1, math.Floor(s.limit*keep))
	if s.ctl != nil {
		s.ctl.cut(s.ceiling)
	}
	s.limit = s.cappedLocked(s.limit)
	if retryAfter > 0 {
		secs := ceilSeconds(retryAfter)
		s.relief.Store(&relief{header: []string{strconv.FormatInt(secs, 10)}, after: time.Duration(min(secs, int64(math.MaxInt64/time.Second))) * time.Second})
	} else {
		s.relief.Store(nil)
	}
	for _, w := range s.queue {
		s.finishLocked(w, reasonCapacity)
	}
	s.queue = s.queue[:0]
	s.busySince, s.lastStanding = time.Time{}, time.Now()
	return true
}

// endReliefLocked ends a relief. The caller holds s.mu.
func (s *Shedder) endReliefLocked() {
	s.ceiling = 0
	s.relief.Store(nil)
	s.limit = s.uncappedLocked()
}

// uncappedLocked returns the limit the Shedder would have without a
// relief. The caller holds s.mu.
func (s *Shedder) uncappedLocked() float64 {
	if s.ctl != nil {
		return s.ctl.effective()
	}
	return s.fixed
}

// ceilSeconds returns d in whole seconds, rounded up, for a Retry-After;
// it cannot overflow, whatever d.
func ceilSeconds(d time.Duration) int64 {
	secs := int64(d / time.Second)
	if d%time.Second > 0 {
		secs++
	}
	return secs
}

// relief is the Retry-After of a relief, immutable once stored.
type relief struct {
	header []string // shared, never modified
	after  time.Duration
}

// retryAfterHeader returns the Retry-After a refusal answers now.
func (s *Shedder) retryAfterHeader() []string {
	if r := s.relief.Load(); r != nil {
		return r.header
	}
	return s.retryAfter
}

// ReliefRetryAfter returns the Retry-After a relief (Relieve) asks
// refusals to answer, and true, while one is in force; 0 and false
// otherwise. A transport that answers refusals its own way (guardgrpc's
// pushback) sends it instead of its own.
func (s *Shedder) ReliefRetryAfter() (time.Duration, bool) {
	if r := s.relief.Load(); r != nil {
		return r.after, true
	}
	return 0, false
}

// cappedLocked returns limit, at most the relief's ceiling. The caller
// holds s.mu.
func (s *Shedder) cappedLocked(limit float64) float64 {
	if s.ceiling > 0 {
		return min(limit, s.ceiling)
	}
	return limit
}

// limitInt returns the limit in force, rounded down, for events and stats.
// The caller must hold s.mu.
func (s *Shedder) limitInt() int { return int(s.limit) }

func (s *Shedder) rejected(ctx context.Context, p Priority, r reason, inFlight, limit int) error {
	if s.obs != nil {
		s.obs.Observe(ctx, event.Event{
			Kind:       event.Shed,
			Dependency: s.name,
			Operation:  event.Operation(ctx),
			Priority:   priorityNames[p],
			Reason:     reasonNames[r],
			InFlight:   inFlight,
			Limit:      limit,
		})
	}
	return errTable[r][p]
}

func (s *Shedder) admittedEvent(ctx context.Context, p Priority, inFlight, limit int, queued time.Duration) {
	if s.obs != nil {
		s.obs.Observe(ctx, event.Event{
			Kind:       event.Admit,
			Dependency: s.name,
			Operation:  event.Operation(ctx),
			Priority:   priorityNames[p],
			InFlight:   inFlight,
			Limit:      limit,
			Duration:   queued,
		})
	}
}

// Stats is a snapshot of a Shedder's counters, for dashboards and tests. It
// is a plain value, owned by the caller.
type Stats struct {
	InFlight int // requests admitted and not yet released
	Limit    int // the limit in force (for a share of 1), rounded down
	Queued   int // requests waiting in the queue now

	Admitted           uint64              // requests admitted, retries included
	AdmittedRetries    uint64              // retries admitted
	AdmittedByPriority map[Priority]uint64 // admitted, by priority

	Shed           uint64              // requests refused
	ShedByReason   map[string]uint64   // refused, by event.Reason* value
	ShedByPriority map[Priority]uint64 // refused, by priority

	QueuedAdmitted uint64        // admitted after waiting in the queue
	QueueTime      time.Duration // total time those waited

	// MinRTT is the adaptive limit's measured no-load latency: zero for a
	// fixed limit or before the first measurement.
	MinRTT time.Duration
}

// Stats returns a snapshot of the counters.
func (s *Shedder) Stats() Stats {
	st := Stats{
		AdmittedByPriority: make(map[Priority]uint64),
		ShedByReason:       make(map[string]uint64),
		ShedByPriority:     make(map[Priority]uint64),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st.InFlight, st.Limit, st.Queued = s.inFlight, s.limitInt(), len(s.queue)
	st.AdmittedRetries = s.admittedRetries
	st.QueuedAdmitted, st.QueueTime = s.queuedAdmitted, s.queueTime
	if s.ctl != nil {
		st.MinRTT = s.ctl.minRTT
	}
	for p := Sheddable; p <= Critical; p++ {
		if n := s.admitted[p]; n > 0 {
			st.Admitted += n
			st.AdmittedByPriority[p] = n
		}
		for r := range numReasons {
			if n := s.shed[p][r]; n > 0 {
				st.Shed += n
				st.ShedByReason[reasonNames[r]] += n
				st.ShedByPriority[p] += n
			}
		}
	}
	return st
}

// Load returns the requests in flight and the current limit: what a gauge
// needs at every scrape, without the maps Stats builds.
func (s *Shedder) Load() (inFlight, limit int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight, s.limitInt()
}
