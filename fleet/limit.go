package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/event"
)

// TokenStore is a token bucket per key that every process of a fleet
// shares: the one place where a fleet-wide rate is counted. The Redis
// implementation is in the redisfleet package of the redisstore module;
// another engine can implement it with the same semantics.
//
// A key's bucket holds at most burst tokens and gains rate tokens a second
// on the store's own clock (not the caller's, so that the processes'
// clocks need not agree); a key the store has never seen, or has forgotten,
// is a full bucket. Every call passes rate and burst, so the store needs no
// configuration of its own; the processes sharing a key must pass the same
// values.
//
// Each call must be atomic on the store and must return by ctx's deadline.
// Implementations must be safe for concurrent use.
type TokenStore interface {
	// Take removes up to want tokens (want is at least 1) from key's
	// bucket and returns how many it removed, got, from 0 to want: as many
	// as the bucket held, whole tokens only. retryIn is how long until the
	// bucket, after the take, holds one whole token: zero when it still
	// does, above zero when got is 0. An error means nothing is known
	// about what was taken.
	Take(ctx context.Context, key string, want int, rate float64, burst int) (got int, retryIn time.Duration, err error)
	// Return puts back n tokens (n is at least 1) taken by Take and not
	// spent; the bucket never holds more than burst.
	Return(ctx context.Context, key string, n int, rate float64, burst int) error
}

// FailureMode says what a Limiter or a Semaphore does while its store
// fails. It is a plain value, safe to copy.
type FailureMode int

const (
	// FailOpen admits requests at this process's share of the limit while
	// the store fails: Rate / Members.Live(), in bursts of Burst /
	// Members.Live() (at least 1), from a local bucket that starts empty,
	// so a failure never admits a burst. When the store answers again, the
	// first take of each key also takes what the fleet's local buckets
	// admitted in the time the shared bucket takes to fill (this
	// process's admissions times Members.Live(), at most Burst), so that
	// a bucket that refilled unseen (or a store that restarted empty) does
	// not add its burst to what was admitted meanwhile. It is the zero
	// FailureMode.
	FailOpen FailureMode = iota
	// FailClosed refuses every request that the tokens already leased
	// cannot pay for, while the store fails, with a RetryAfter that lasts
	// until the next probe of the store has answered.
	FailClosed
)

// String returns "FailOpen" or "FailClosed".
func (m FailureMode) String() string {
	switch m {
	case FailOpen:
		return "FailOpen"
	case FailClosed:
		return "FailClosed"
	}
	return fmt.Sprintf("FailureMode(%d)", int(m))
}

// Defaults used for zero LimiterConfig fields.
const (
	// DefaultRate is the fleet-wide rate of each key of a zero Rate: 10
	// requests a second, as in the local ratelimit package.
	DefaultRate = 10
	// DefaultLease is how long a process keeps leased tokens: 100 ms.
	DefaultLease = 100 * time.Millisecond
	// DefaultStoreTimeout bounds each call to the store: 50 ms.
	DefaultStoreTimeout = 50 * time.Millisecond
	// DefaultProbeInterval is how often a failed store is tried again:
	// every 200 ms.
	DefaultProbeInterval = 200 * time.Millisecond
	// DefaultMaxKeys is the number of keys a Limiter tracks at most.
	DefaultMaxKeys = 100_000
)

// MaxKeyLen is the length above which a key is sent to the store as
// "sha256:" and the base64url SHA-256 of the key (50 bytes), so that the
// memory a key costs is bounded whatever clients send. Every process
// derives the same name, so the keys stay shared.
const MaxKeyLen = 64

// ErrInvalidConfig is the sentinel of every error NewLimiter returns for a
// LimiterConfig it rejects.
var ErrInvalidConfig = errors.New("fleet: invalid config")

// ErrLimited is the sentinel of a refusal. errors.As to *LimitedError
// tells when to retry.
var ErrLimited = errors.New("fleet: rate limited")

// ErrClosed is what Allow returns once Close has been called.
var ErrClosed = errors.New("fleet: limiter closed")

// LimitedError is the refusal Allow returns. It Is ErrLimited. It is a
// plain value, safe for concurrent use once returned.
type LimitedError struct {
	// RetryAfter is how long to wait before the key's next request can be
	// admitted, if nothing else spends the key in between: above zero, in
	// whole milliseconds, rounded up.
	RetryAfter time.Duration
	// Err is the store's error when the refusal is FailClosed's, nil when
	// the key's rate is spent.
	Err error
}

// Error reads "fleet: rate limited; retry after 250ms", followed by the
// store's error for a FailClosed refusal.
func (e *LimitedError) Error() string {
	s := ErrLimited.Error() + "; retry after " + e.RetryAfter.String()
	if e.Err != nil {
		s += ": store unavailable: " + e.Err.Error()
	}
	return s
}

// Is reports whether target is ErrLimited.
func (e *LimitedError) Is(target error) bool { return target == ErrLimited }

// Unwrap returns Err.
func (e *LimitedError) Unwrap() error { return e.Err }

// LimiterConfig configures a Limiter; NewLimiter copies it. Store is the
// only field without a default. It is a plain value; what it points to
// (Store, Members, Rand, Observer) must be safe for concurrent use.
type LimiterConfig struct {
	// Store is the shared token bucket. It is required.
	Store TokenStore

	// Rate is the number of requests a second each key may make across
	// the whole fleet. Zero means DefaultRate (10); allowed values are
	// finite and positive.
	Rate float64
	// Burst is the number of requests a key may make at once across the
	// fleet, the size of its shared bucket. Zero means Rate rounded up (one
	// second of traffic), at least 1; a negative value is invalid.
	Burst int

	// Lease is how long this process keeps the tokens it takes from the
	// store before it gives back those it did not spend (within Lease/2
	// more). It also sizes each take: this process's own request rate for
	// the key times Lease. Zero means DefaultLease (100 ms); a negative
	// value is invalid.
	Lease time.Duration
	// MaxLease is the number of tokens one take leases at most: the bound
	// on what one process holds, and so on what it can over-admit when the
	// store loses its state (a failover to a replica that missed the last
	// writes). Zero means Rate × Lease rounded up, at most Burst and at
	// least 1; a negative value is invalid.
	MaxLease int

	// StoreTimeout bounds each call to the store, so a store that hangs
	// costs a request at most this long, and only until the store is
	// marked as failed. Zero means DefaultStoreTimeout (50 ms); a negative
	// value is invalid: a call without a bound would hang requests.
	StoreTimeout time.Duration
	// ProbeInterval is how often a failed store is tried again, by a take
	// in the background that no request waits for; the first success
	// ends the failure. Zero means DefaultProbeInterval (200 ms); a
	// negative value is invalid.
	ProbeInterval time.Duration
	// OnStoreFailure is what Allow does while the store fails. The zero
	// value is FailOpen.
	OnStoreFailure FailureMode
	// Members counts the processes sharing the limit, for FailOpen's
	// share. Nil means Fixed(1): each process alone admits the whole
	// Rate while the store fails, so set it for a fleet.
	Members Members

	// Rand returns uniform draws in [0, 1) for the jitter of the takes
	// that follow a spent bucket; nil means math/rand/v2. It must be safe
	// for concurrent use.
	Rand func() float64

	// MaxKeys is the number of keys tracked at most; the least recently
	// seen key is forgotten for a new one, after giving back its tokens.
	// Forgetting a key loses nothing the store does not keep. Zero means
	// DefaultMaxKeys (100,000); a negative value is invalid. Each key costs
	// about 230 bytes and its name (at most 64 bytes, see MaxKeyLen):
	// measured, 246 bytes a key of 16 bytes.
	MaxKeys int

	// Name names the limit in events (event.Event.Dependency).
	Name string
	// Observer receives an event.SharedStore when the store stops
	// answering and when it answers again, transitions only. Nil means
	// none.
	Observer event.Observer
}

// Stats counts what a Limiter did since NewLimiter. A plain value, a
// snapshot safe to read from any goroutine.
type Stats struct {
	// Admitted and Refused count Allow's answers (context errors and
	// ErrClosed are neither).
	Admitted, Refused uint64
	// Takes and Returns count the calls to the store, failed ones included:
	// the round trips the limiter paid.
	Takes, Returns uint64
	// StoreErrors counts the store calls that failed or timed out.
	StoreErrors uint64
	// Failing reports whether the store is failing now: Allow is using
	// the OnStoreFailure mode.
	Failing bool
}

// maxShards and minPerShard cut the key table as ratelimit does; workers
// run the background takes and returns, queued up to queueLen.
const (
	maxShards   = 64
	minPerShard = 16
	workers     = 2
	queueLen    = 1024
)

// Limiter is a rate limit per key that holds across every process sharing
// a TokenStore, with a local fast path: the process leases tokens from the
// store, a few at a time, and spends them without a round trip. It is safe
// for concurrent use.
//
// A take asks for this process's recent request rate for the key times
// Lease (at least 1, at most MaxLease); when what is left falls to a
// quarter of that, the next take runs in the background, so that a
// process with a steady share of the traffic rarely makes a request wait
// for the store. When a take finds the shared bucket spent (it came back
// short, or left less than a token), the process refuses the key locally,
// without asking the store, and takes again in the background after half
// a MaxLease of its own requests (jittered, and never later than the
// bucket takes to fill, so that no refill goes unseen): the processes
// sharing a spent key each ask about as often as their share of its
// traffic, and get a share of the refill in proportion. Tokens unspent
// when their lease ends go back to the store.
//
// NewLimiter starts three goroutines (two for background takes and
// returns, one that ends leases), and a key whose bucket is spent has a
// timer for its next take; Close stops them. Allow has no twin that takes
// the time as a parameter: its leases end and its takes run in the
// background on the clock, so tests run it under testing/synctest.
type Limiter struct {
	name     string
	obs      event.Observer
	store    TokenStore
	rate     float64
	burst    int
	lease    int64 // ns
	maxLease int
	timeout  time.Duration
	probe    int64 // ns
	mode     FailureMode
	members  Members
	rand     func() float64
	perShard int
	mask     uint64
	seed     maphash.Seed
	epoch    time.Time
	shards   []lshard

	rtt       atomic.Int64 // ns, a moving average of the store's answers
	failing   atomic.Bool
	failErr   atomic.Pointer[error]
	failGen   atomic.Int64 // incremented at each failure's start
	nextProbe atomic.Int64 // ns since epoch

	admitted, refused, takes, returns, storeErrs atomic.Uint64

	jobs    chan job
	bg      context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup
	closed  atomic.Bool
	closeMu sync.Mutex
}

type lshard struct {
	mu   sync.Mutex
	keys map[string]*lentry
	held map[*lentry]struct{} // entries holding leased tokens
	lru  lentry               // sentinel: lru.next the most recently seen
	_    [32]byte
}

type lentry struct {
	key        string
	prev, next *lentry
	gone       bool // forgotten for a new key: what it gets is given back

	tokens  int   // leased, unspent
	expires int64 // ns since epoch: the lease's end

	seen     int     // requests since winStart
	winStart int64   // ns since epoch
	est      float64 // this process's request rate for the key, per second

	nextTry int64 // ns since epoch: no take before, after a short one
	retryAt int64 // ns since epoch: the earliest admission the last short take allows

	pending chan struct{} // closed when the take in flight ends
	poll    *time.Timer   // takes again at nextTry, after a short take
	shortAt int64         // ns since epoch of the last short take
	seenAt  int64         // ns since epoch of the last request

	fbGen    int64 // failGen of the fallback bucket
	fbTokens float64
	fbAt     int64
	// debt is what the fleet's FailOpen admitted, as this process sees
	// it: its own admissions times Members.Live(), up to the fallback
	// buckets' size (what they admit in the time the shared bucket takes
	// to fill, at most Burst). The first take after the failure takes it
	// too, and spends it on nothing, so that a bucket that refilled unseen
	// during the failure (or a Redis that restarted empty) does not add
	// its burst to what the fallback admitted. The processes see the store
	// again at different times: the first one back pays for all, before
	// it can spend the burst; the others find the bucket spent, and their
	// debt ends with their first take.
	debt int
}

type job struct {
	s    *lshard
	e    *lentry
	ch   chan struct{} // e.pending, closed when the take ends
	want int           // take want tokens; 0: return n
	n    int
}

// NewLimiter returns a Limiter configured by cfg, or an error that Is
// ErrInvalidConfig and names every invalid field. Close it when done.
func NewLimiter(cfg LimiterConfig) (*Limiter, error) {
	var errs []error
	if cfg.Store == nil {
		errs = append(errs, invalid("Store", "nil", "a TokenStore, such as a redisfleet.Store"))
	}
	r := cfg.Rate
	switch {
	case r == 0:
		r = DefaultRate
	case !(r > 0) || math.IsInf(r, 1):
		errs = append(errs, invalid("Rate", r, "a finite number of requests per second above 0, or 0 for the default 10"))
		r = DefaultRate
	}
	burst := orDefault(cfg.Burst, int(min(math.Ceil(r), math.MaxInt32)), "Burst", "a positive count, or 0 for Rate rounded up", &errs)
	lease := orDefault(cfg.Lease, DefaultLease, "Lease", "a positive duration, or 0 for the default 100ms", &errs)
	maxLease := orDefault(cfg.MaxLease, int(max(min(math.Ceil(r*lease.Seconds()), float64(burst)), 1)),
		"MaxLease", "a positive count, or 0 for Rate × Lease", &errs)
	maxLease = min(maxLease, burst)
	timeout := orDefault(cfg.StoreTimeout, DefaultStoreTimeout, "StoreTimeout", "a positive duration, or 0 for the default 50ms", &errs)
	probe := orDefault(cfg.ProbeInterval, DefaultProbeInterval, "ProbeInterval", "a positive duration, or 0 for the default 200ms", &errs)
	if cfg.OnStoreFailure != FailOpen && cfg.OnStoreFailure != FailClosed {
		errs = append(errs, invalid("OnStoreFailure", cfg.OnStoreFailure, "FailOpen or FailClosed"))
	}
	maxKeys := orDefault(cfg.MaxKeys, DefaultMaxKeys, "MaxKeys", "a positive count, or 0 for the default 100000", &errs)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	members := cfg.Members
	if members == nil {
		members = Fixed(1)
	}
	rnd := cfg.Rand
	if rnd == nil {
		rnd = rand.Float64
	}
	n := 1
	for n < maxShards && n*2*minPerShard <= maxKeys {
		n *= 2
	}
	l := &Limiter{
		name:     cfg.Name,
		obs:      cfg.Observer,
		store:    cfg.Store,
		rate:     r,
		burst:    burst,
		lease:    int64(lease),
		maxLease: maxLease,
		timeout:  timeout,
		probe:    int64(probe),
		mode:     cfg.OnStoreFailure,
		members:  members,
		rand:     rnd,
		perShard: max(maxKeys/n, 1),
		mask:     uint64(n - 1),
		seed:     maphash.MakeSeed(),
		epoch:    time.Now(),
		shards:   make([]lshard, n),
		jobs:     make(chan job, queueLen),
	}
	for i := range l.shards {
		s := &l.shards[i]
		s.keys = make(map[string]*lentry)
		s.held = make(map[*lentry]struct{})
		s.lru.next, s.lru.prev = &s.lru, &s.lru
	}
	l.bg, l.stop = context.WithCancel(context.Background())
	for range workers {
		l.wg.Go(l.work)
	}
	l.wg.Go(l.expire)
	return l, nil
}

// orDefault returns v, or def when v is zero; a negative v is invalid: it
// adds the error naming field to errs, and returns def.
func orDefault[T int | time.Duration](v, def T, field, want string, errs *[]error) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		*errs = append(*errs, invalid(field, v, want))
		return def
	}
	return v
}

func invalid(field string, got any, want string) error {
	return &configError{fmt.Sprintf("fleet: LimiterConfig.%s is %v; want %s", field, got, want)}
}

type configError struct{ msg string }

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }

// StoreKey is the name under which Allow sends key to the store: key
// itself, or, when it is longer than MaxKeyLen, "sha256:" and the base64url
// SHA-256 of key.
func StoreKey(key string) string {
	if len(key) <= MaxKeyLen {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:])
}

func (l *Limiter) now() int64 { return int64(time.Since(l.epoch)) }

// Allow charges one request to key. It returns nil when the request is
// admitted; a *LimitedError (which Is ErrLimited) saying when to retry
// when it is refused; ctx's error when ctx ended while the request waited
// for the store; or ErrClosed after Close.
//
// A request waits for the store only when this process holds no token for
// key and is not refusing it locally, and then at most StoreTimeout; while
// the store fails, no request waits for it.
func (l *Limiter) Allow(ctx context.Context, key string) error {
	if l.closed.Load() {
		return ErrClosed
	}
	key = StoreKey(key)
	s := &l.shards[maphash.String(l.seed, key)&l.mask]
	s.mu.Lock()
	now := l.now()
	e := l.entry(s, key)
	e.seen++
	e.seenAt = now
	for {
		if e.tokens > 0 {
			e.tokens--
			if e.tokens == 0 {
				delete(s.held, e)
			}
			l.prefetch(s, e, now)
			s.mu.Unlock()
			l.admitted.Add(1)
			return nil
		}
		if l.failing.Load() {
			err := l.fallback(s, e, now)
			s.mu.Unlock()
			if err != nil {
				l.refused.Add(1)
			} else {
				l.admitted.Add(1)
			}
			return err
		}
		if now < e.nextTry {
			wait := e.retryAt - now
			s.mu.Unlock()
			l.refused.Add(1)
			return limited(wait, nil)
		}
		if ch := e.pending; ch != nil {
			s.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			case <-l.bg.Done():
				return ErrClosed
			}
			s.mu.Lock()
			now = l.now()
			e = l.entry(s, key)
			continue
		}
		want := l.want(e, now)
		ch := make(chan struct{})
		e.pending = ch
		s.mu.Unlock()
		got, retry, err := l.take(ctx, key, want)
		s.mu.Lock()
		now = l.now()
		e.pending = nil
		close(ch)
		if err != nil && ctx.Err() != nil {
			s.mu.Unlock()
			return ctx.Err()
		}
		l.settle(s, e, want, got, retry, err, now)
		if e.gone {
			e = l.entry(s, key)
		}
	}
}

// entry returns key's entry, made the most recently seen, adding it if it
// is new. The caller holds s.mu.
func (l *Limiter) entry(s *lshard, key string) *lentry {
	if e := s.keys[key]; e != nil {
		e.unlink()
		s.pushFront(e)
		return e
	}
	if len(s.keys) >= l.perShard {
		old := s.lru.prev
		old.unlink()
		delete(s.keys, old.key)
		old.gone = true
		if old.poll != nil {
			old.poll.Stop()
		}
		if old.tokens > 0 {
			l.enqueue(job{s: s, e: old, n: old.tokens})
			old.tokens = 0
			delete(s.held, old)
		}
	}
	e := &lentry{key: key, winStart: l.now()}
	s.keys[key] = e
	s.pushFront(e)
	return e
}

// want is the size of the next take for e: this process's request rate
// for the key times Lease, at least 1 and at most MaxLease, less the
// tokens e still holds. The caller holds the shard's lock.
func (l *Limiter) want(e *lentry, now int64) int {
	el := now - e.winStart
	if el >= l.lease/4 || (e.est == 0 && e.seen > 1) {
		obs := float64(e.seen) / (float64(max(el, int64(time.Millisecond))) / 1e9)
		if e.est == 0 {
			e.est = obs
		} else {
			e.est = (e.est + obs) / 2
		}
		e.seen, e.winStart = 0, now
	}
	w := min(math.Ceil(e.est*float64(l.lease)/1e9), float64(l.maxLease))
	return max(int(w)-e.tokens, 1) + e.debt
}

// prefetch starts a take in the background when e's tokens are down to a
// quarter of a lease. The caller holds s.mu.
func (l *Limiter) prefetch(s *lshard, e *lentry, now int64) {
	if e.pending != nil || now < e.nextTry || l.failing.Load() {
		return
	}
	lease := min(math.Ceil(e.est*float64(l.lease)/1e9), float64(l.maxLease))
	if lease < 4 || float64(e.tokens) > lease/4 {
		return
	}
	want := l.want(e, now)
	if want < 1 {
		return
	}
	ch := make(chan struct{})
	e.pending = ch
	if !l.enqueue(job{s: s, e: e, ch: ch, want: want}) {
		e.pending = nil
		close(ch)
	}
}

// enqueue hands j to the background workers, unless their queue is full
// or the limiter is closing.
func (l *Limiter) enqueue(j job) bool {
	select {
	case l.jobs <- j:
		return true
	default:
		return false
	}
}

// settle applies a take's outcome to e. The caller holds s.mu.
func (l *Limiter) settle(s *lshard, e *lentry, want, got int, retry time.Duration, err error, now int64) {
	if err != nil {
		l.fail(err, now)
		return
	}
	l.recover()
	short := got < want || retry > 0
	if e.debt > 0 {
		got -= min(got, e.debt)
		e.debt = 0
	}
	if e.gone {
		if got > 0 {
			l.enqueue(job{s: s, e: e, n: got})
		}
		return
	}
	if got > 0 {
		if e.tokens == 0 {
			s.held[e] = struct{}{}
		}
		e.tokens += got
		e.expires = now + l.lease
	}
	if short {
		// The shared bucket is spent: every process sharing it asks again
		// after half a MaxLease of its own requests, so that each gets a
		// share of the refill in proportion to its traffic, at a round
		// trip per half lease; but before the bucket is full, so that
		// nothing refills unseen, and not before a token is there.
		wait := l.lease
		if e.est > 0 {
			wait = nanos(max(float64(l.maxLease)/2, 1) / e.est)
		}
		// Jitter, so that processes started together do not ask together.
		wait = int64(float64(wait) * (0.8 + 0.4*l.rand()))
		wait = min(wait, nanos(float64(l.burst)/l.rate))
		wait = max(wait, int64(retry))
		e.nextTry = now + wait
		e.retryAt = e.nextTry
		e.shortAt = now
		// Take again in the background, early enough for the answer to
		// be there at nextTry, so that no request waits for it.
		early := time.Duration(max(wait-2*l.rtt.Load()-int64(time.Millisecond), 0))
		if e.poll == nil {
			e.poll = time.AfterFunc(early, func() { l.pollAgain(s, e) })
		} else {
			e.poll.Reset(early)
		}
	}
}

// pollAgain takes for e in the background after a short take, if the key
// has had requests since. It runs on e.poll's goroutine.
func (l *Limiter) pollAgain(s *lshard, e *lentry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.closed.Load() || e.gone || e.pending != nil || e.tokens > 0 || e.seenAt <= e.shortAt || l.failing.Load() {
		return
	}
	want := l.want(e, l.now())
	ch := make(chan struct{})
	e.pending = ch
	if !l.enqueue(job{s: s, e: e, ch: ch, want: want}) {
		e.pending = nil
		close(ch)
	}
}

// take asks the store for want tokens of key, within StoreTimeout, and
// checks the answer.
func (l *Limiter) take(ctx context.Context, key string, want int) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	l.takes.Add(1)
	t0 := time.Now()
	got, retry, err := l.store.Take(ctx, key, want, l.rate, l.burst)
	el := int64(time.Since(t0))
	l.rtt.Store((l.rtt.Load()*7 + el) / 8)
	if err != nil {
		l.storeErrs.Add(1)
		return 0, 0, err
	}
	got = min(max(got, 0), want) // a broken store: more than asked is not spent
	if got == 0 && retry <= 0 {
		retry = time.Duration(nanos(1 / l.rate))
	}
	return got, max(retry, 0), nil
}

func (l *Limiter) giveBack(ctx context.Context, key string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	l.returns.Add(1)
	err := l.store.Return(ctx, key, n, l.rate, l.burst)
	if err != nil {
		l.storeErrs.Add(1)
	}
	return err
}

// fail marks the store as failing, if it is not already.
func (l *Limiter) fail(err error, now int64) {
	l.failErr.Store(&err)
	if !l.failing.Load() {
		l.failGen.Add(1)
		l.nextProbe.Store(now + l.probe)
		if l.failing.CompareAndSwap(false, true) {
			l.storeEvent(event.OutcomeError, err)
		}
	}
}

func (l *Limiter) recover() {
	if l.failing.Load() && l.failing.CompareAndSwap(true, false) {
		l.storeEvent(event.OutcomeOK, nil)
	}
}

// storeEvent reports a transition of the store to the Observer.
func (l *Limiter) storeEvent(outcome string, err error) {
	if l.obs == nil {
		return
	}
	reason := event.ReasonFailOpen
	if l.mode == FailClosed {
		reason = event.ReasonFailClosed
	}
	l.obs.Observe(context.Background(), event.Event{Kind: event.SharedStore, Dependency: l.name, Outcome: outcome,
		Reason: reason, Err: err, Remaining: -1})
}

// fallback answers for e while the store fails, and starts a probe of the
// store when one is due. The caller holds s.mu.
func (l *Limiter) fallback(s *lshard, e *lentry, now int64) error {
	next := l.nextProbe.Load()
	if now >= next && e.pending == nil && l.nextProbe.CompareAndSwap(next, now+l.probe) {
		ch := make(chan struct{})
		e.pending = ch
		if !l.enqueue(job{s: s, e: e, ch: ch, want: 1 + e.debt}) {
			e.pending = nil
			close(ch)
		}
		next = now + l.probe
	}
	if l.mode == FailClosed {
		var err error
		if p := l.failErr.Load(); p != nil {
			err = *p
		}
		return limited(max(next-now, int64(l.timeout)), err)
	}
	live := float64(l.members.Live())
	if live < 1 {
		live = 1
	}
	r := l.rate / live
	b := max(math.Floor(float64(l.burst)/live), 1)
	if gen := l.failGen.Load(); e.fbGen != gen {
		e.fbGen, e.fbTokens, e.fbAt = gen, 0, now
	}
	if now > e.fbAt {
		e.fbTokens = min(e.fbTokens+float64(now-e.fbAt)/1e9*r, b)
		e.fbAt = now
	}
	if e.fbTokens >= 1 {
		e.fbTokens--
		e.debt = min(e.debt+int(live), int(b*live))
		return nil
	}
	return limited(nanos((1-e.fbTokens)/r), nil)
}

// maxWait caps every computed wait: about 73 years, far from overflow
// when added to a clock reading.
const maxWait = math.MaxInt64 / 4

// nanos converts seconds to ns, capped at maxWait.
func nanos(seconds float64) int64 {
	ns := math.Ceil(seconds * 1e9)
	if !(ns < maxWait) { // also NaN
		return maxWait
	}
	return max(int64(ns), 0)
}

// limited is a refusal of wait ns, rounded up to whole milliseconds, at
// least one.
func limited(wait int64, err error) error {
	const ms = int64(time.Millisecond)
	wait = min(max(wait, 1), maxWait)
	wait = (wait + ms - 1) / ms * ms
	return &LimitedError{RetryAfter: time.Duration(wait), Err: err}
}

// work runs background takes (prefetches and probes) and returns.
func (l *Limiter) work() {
	for {
		select {
		case <-l.bg.Done():
			return
		case j := <-l.jobs:
			if j.want == 0 {
				if err := l.giveBack(l.bg, j.e.key, j.n); err != nil && l.bg.Err() == nil {
					l.fail(err, l.now())
				}
				continue
			}
			got, retry, err := l.take(l.bg, j.e.key, j.want)
			j.s.mu.Lock()
			j.e.pending = nil
			close(j.ch)
			if l.bg.Err() == nil || err == nil {
				l.settle(j.s, j.e, j.want, got, retry, err, l.now())
			}
			j.s.mu.Unlock()
		}
	}
}

// expire gives back the tokens of leases that ended, every Lease/2.
func (l *Limiter) expire() {
	t := time.NewTicker(time.Duration(max(l.lease/2, int64(time.Millisecond))))
	defer t.Stop()
	type back struct {
		key string
		n   int
	}
	var out []back
	for {
		select {
		case <-l.bg.Done():
			return
		case <-t.C:
		}
		now := l.now()
		out = out[:0]
		for i := range l.shards {
			s := &l.shards[i]
			s.mu.Lock()
			for e := range s.held {
				if now >= e.expires && e.pending == nil {
					out = append(out, back{e.key, e.tokens})
					e.tokens = 0
					delete(s.held, e)
				}
			}
			s.mu.Unlock()
		}
		for _, b := range out {
			if err := l.giveBack(l.bg, b.key, b.n); err != nil && l.bg.Err() == nil {
				l.fail(err, l.now())
			}
		}
	}
}

// Close stops the limiter's goroutines and gives back every leased token,
// each return bounded by StoreTimeout; it returns the first error of
// those returns. Allow returns ErrClosed once Close has begun. Close is
// idempotent: a second call returns nil.
func (l *Limiter) Close() error {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	if l.closed.Swap(true) {
		return nil
	}
	l.stop()
	l.wg.Wait()
	var first error
	var backs []job
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		for e := range s.held {
			backs = append(backs, job{e: e, n: e.tokens})
			e.tokens = 0
			delete(s.held, e)
		}
		for _, e := range s.keys {
			if e.poll != nil {
				e.poll.Stop()
			}
		}
		s.mu.Unlock()
	}
	// Jobs queued and not yet run: the returns are made here, and the
	// takes' waiters released.
	for drained := false; !drained; {
		select {
		case j := <-l.jobs:
			if j.want == 0 {
				backs = append(backs, j)
				continue
			}
			j.s.mu.Lock()
			if j.e.pending == j.ch {
				j.e.pending = nil
			}
			close(j.ch)
			j.s.mu.Unlock()
		default:
			drained = true
		}
	}
	for _, b := range backs {
		if err := l.giveBack(context.Background(), b.e.key, b.n); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Stats returns the limiter's counts so far.
func (l *Limiter) Stats() Stats {
	return Stats{
		Admitted:    l.admitted.Load(),
		Refused:     l.refused.Load(),
		Takes:       l.takes.Load(),
		Returns:     l.returns.Load(),
		StoreErrors: l.storeErrs.Load(),
		Failing:     l.failing.Load(),
	}
}

func (s *lshard) pushFront(e *lentry) {
	e.prev, e.next = &s.lru, s.lru.next
	s.lru.next.prev = e
	s.lru.next = e
}

func (e *lentry) unlink() {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}
