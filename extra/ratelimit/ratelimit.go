// Package ratelimit limits the rate of requests of each client of a server:
// a token bucket per key (an API key, a principal, an address), so that one
// client's retries cannot spend the capacity a load shedder keeps for the
// others.
//
// Shedding protects a server from the sum of its load; it does not say
// whose load. A client that retries every refusal at once keeps the server
// at its limit, and the shedder then refuses everyone else in proportion. A
// per-client limit in front of the shedder refuses that client, early and
// cheaply, with 429 Too Many Requests and a Retry-After that is honest: a
// request retried after it is admitted.
//
// The buckets are golang.org/x/time/rate limiters. Memory is bounded by
// Config.MaxKeys: a key is dropped only once its bucket has refilled (a full
// bucket is what a new key gets, so dropping it changes nothing), never
// while it is spending, so flooding the table with new keys cannot reset a
// client's bucket.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/fleet"
)

// Defaults used for zero Config fields.
const (
	// DefaultRate is the rate a zero Config allows each key: 10 requests
	// per second, a human clicking fast or a well-behaved script.
	DefaultRate = 10
	// DefaultMaxKeys is the number of keys a zero Config tracks at most:
	// about 17 MB (see Limiter).
	DefaultMaxKeys = 100_000
	// DefaultIPv6PrefixBits is the prefix length by which a zero Config's
	// default key groups IPv6 clients: a /64, the block a single site or
	// host is usually given, inside which it can pick any address.
	DefaultIPv6PrefixBits = 64
)

// maxShards bounds the number of independently locked parts of the key
// table; minPerShard keeps each part big enough that the least recently
// seen key of a part is close to the least recently seen of all.
const (
	maxShards   = 64
	minPerShard = 16
)

// evictScan is the number of the least recently seen keys of a full shard
// that a new key looks at for one whose bucket is full.
const evictScan = 4

// maxRetryAfter caps Retry-After, in seconds (34 years), for a Rate so low
// that the wait would overflow a time.Duration.
const maxRetryAfter = 1 << 30

// ErrInvalidConfig is the sentinel of every error New returns for a Config
// it rejects.
var ErrInvalidConfig = errors.New("ratelimit: invalid config")

// ErrLimited is the sentinel of a refusal: the key's rate was spent.
// errors.As to *LimitedError tells when to retry.
var ErrLimited = errors.New("ratelimit: rate limited")

// LimitedError is the refusal Allow returns. It Is ErrLimited. It is a
// plain value, safe for concurrent use once returned.
type LimitedError struct {
	// RetryAfter is how long the client must wait before its next request
	// is admitted (if it sends nothing in between): at least one second,
	// in whole seconds, as Retry-After carries it.
	RetryAfter time.Duration
}

// Error reads "ratelimit: rate limited; retry after 2s".
func (e *LimitedError) Error() string {
	return ErrLimited.Error() + "; retry after " + e.RetryAfter.String()
}

// Is reports whether target is ErrLimited.
func (e *LimitedError) Is(target error) bool { return target == ErrLimited }

// Config configures a Limiter. The zero Config is valid: each client
// address (each IPv6 /64) may send DefaultRate requests per second, in
// bursts of as many, and at most DefaultMaxKeys addresses are tracked. New
// copies it.
type Config struct {
	// Name labels the limiter's events (Event.Dependency), for example the
	// server's name. Empty is fine.
	Name string

	// Key returns the client a request is charged to: an API key, an
	// authenticated principal, an address. Nil means the IP address of
	// Request.RemoteAddr, the peer, with or without a port: an IPv4
	// address (IPv4-mapped IPv6 included) is one client, and an IPv6
	// address is charged to its prefix of IPv6PrefixBits (a /64 by
	// default), because a host can use any address of its block. A
	// RemoteAddr that is not an IP address is charged to one bucket shared
	// by all such requests, so that garbage cannot buy a bucket per value.
	// Behind a proxy, every request shares the proxy's bucket, so read the
	// client address from a header your proxy sets (and that clients
	// cannot) instead.
	//
	// An empty key is a key like any other: return "" for the requests you
	// mean to limit as a whole (anonymous traffic, say), which then share
	// one bucket. An error means the request cannot be attributed (a
	// malformed credential): it is answered 400 Bad Request without running
	// the handler, because admitting it unlimited would let any client
	// evade its limit by sending garbage, and charging it to a shared bucket
	// would let one broken client starve every other one in that bucket.
	// Put authentication before the limiter so that Key sees only requests
	// it can attribute.
	//
	// Key is called concurrently and must be fast. Keys of any length are
	// accepted: the table stores a 64-bit hash of each key, with a random
	// per-process seed, so a long key costs no memory and two live keys
	// share a bucket with a probability of about MaxKeys/2^64 per new key.
	Key func(*http.Request) (string, error)

	// IPv6PrefixBits is the length of the prefix by which the default Key
	// groups IPv6 addresses: every address of one prefix shares a bucket.
	// Zero means DefaultIPv6PrefixBits (64); allowed values are 1 to 128
	// (128 gives each address its own bucket, as IPv4 has). It does not
	// apply when Key is set.
	IPv6PrefixBits int

	// Rate is the sustained number of requests per second each key may
	// make. Zero means DefaultRate (10); allowed values are finite and
	// positive (0.1 is one request every 10 s).
	Rate float64
	// Burst is the number of requests a key may make at once, the size of
	// its bucket; a new key's bucket starts full. Zero means Rate rounded
	// up (one second of traffic), at least 1; a negative value is invalid.
	Burst int

	// MaxKeys is the number of keys tracked at most. A key is dropped only
	// when its bucket is full, which is what it would start with again: a
	// key that is spending keeps its bucket, whatever other keys arrive.
	// When the table is full and its least recently seen keys are all
	// spending, a new key is charged to an overflow bucket (with Rate and
	// Burst) that it shares with the other new keys of its shard until room
	// frees up, so a table too small for the clients admits less than
	// their limits, never more. Zero means DefaultMaxKeys (100,000); a
	// negative value is invalid. Each key costs about 175 bytes (see
	// Limiter).
	MaxKeys int

	// Shared, when set, charges every request to a fleet-wide limit
	// instead of this process's own buckets: a fleet.Limiter whose
	// TokenStore every instance of the server shares (such as
	// redisfleet's, on Redis), so that a client's limit holds however a
	// load balancer spreads its requests. Its LimiterConfig then sets the
	// rate, the burst and the number of keys: Rate, Burst and MaxKeys
	// must be zero. Key is used as with local buckets; the default key is
	// the text of the client's prefix ("192.0.2.7/32", "2001:db8::/64"),
	// or "-" for a RemoteAddr that is not an address. The refusal's
	// Retry-After is the fleet limiter's RetryAfter rounded up to whole
	// seconds; a request the fleet limiter can neither admit nor refuse
	// (Close was called, or the request's context ended while it waited
	// for the store) is answered 503 Service Unavailable without running
	// the handler. The caller keeps ownership of the fleet.Limiter and
	// closes it. Nil means local buckets.
	Shared *fleet.Limiter

	// Observer receives an event.Shed with Reason event.ReasonRateLimit for
	// every refused request: Delay is the Retry-After answered, and Err is
	// the Key error when the request could not be attributed. Admitted
	// requests are not reported. Nil means none.
	Observer event.Observer
}

// Limiter limits the request rate of each key with a token bucket
// (golang.org/x/time/rate). It is safe for concurrent use; its table is cut
// into up to 64 independently locked shards.
//
// Memory is bounded by MaxKeys whatever the clients send: a key is stored as
// a 64-bit hash, and its bucket and table entry take about 175 bytes
// (measured: 1,000,000 distinct keys through a limiter with the default
// MaxKeys of 100,000 leave it holding 99,968 keys in 16.7 MB of live heap;
// it never holds more, whatever the number of keys). A key idle long enough
// for its bucket to refill is dropped on a later request to its shard (each
// request looks at two of the least recently seen keys of its shard),
// because a full bucket is what a new key gets anyway: dropping it loses
// nothing. When a shard is full, a new key takes the place of one of its
// four least recently seen keys whose bucket is full; if none is, the new
// key shares the shard's overflow bucket. A bucket below full is never
// dropped: forgetting it would hand a client that floods new keys a fresh
// bucket of its own.
//
// Admitting a request of a known key takes one shard lock and allocates
// nothing; so does the middleware's refusal with a Retry-After of up to a
// minute (Allow's refusal allocates its error). A new key allocates its
// bucket, unless it takes the place of a full one, which it reuses.
type Limiter struct {
	name     string
	key      func(*http.Request) (string, error) // nil: the default, by address
	v6bits   int
	limit    rate.Limit
	burst    int
	refill   int64 // ns for an empty bucket to fill: a key idle this long is dropped
	perShard int
	mask     uint64
	seed     maphash.Seed
	obs      event.Observer
	epoch    time.Time
	shards   []shard
	shared   *fleet.Limiter
}

type shard struct {
	mu   sync.Mutex
	keys map[uint64]*entry
	lru  entry // sentinel: lru.next is the most recently seen, lru.prev the least
	// over is the bucket of the new keys that found the shard full of
	// buckets below full.
	over *rate.Limiter
	_    [32]byte
}

type entry struct {
	hash       uint64
	last       int64 // ns since epoch of the last request
	prev, next *entry
	lim        *rate.Limiter
}

// New returns a Limiter configured by cfg, or an error that Is
// ErrInvalidConfig and names every invalid field.
func New(cfg Config) (*Limiter, error) {
	var errs []error
	r := cfg.Rate
	switch {
	case r == 0:
		r = DefaultRate
	case !(r > 0) || math.IsInf(r, 1): // also NaN
		errs = append(errs, invalid("Rate", r, "a finite number of requests per second above 0, or 0 for the default 10"))
		r = DefaultRate
	}
	burst := cfg.Burst
	switch {
	case burst == 0:
		burst = int(min(math.Ceil(r), math.MaxInt32))
	case burst < 0:
		errs = append(errs, invalid("Burst", burst, "a positive count, or 0 for Rate rounded up"))
	}
	maxKeys := cfg.MaxKeys
	switch {
	case maxKeys == 0:
		maxKeys = DefaultMaxKeys
	case maxKeys < 0:
		errs = append(errs, invalid("MaxKeys", maxKeys, "a positive count, or 0 for the default 100000"))
	}
	v6bits := cfg.IPv6PrefixBits
	switch {
	case v6bits == 0:
		v6bits = DefaultIPv6PrefixBits
	case v6bits < 0 || v6bits > 128:
		errs = append(errs, invalid("IPv6PrefixBits", v6bits, "a prefix length of 1 to 128 bits, or 0 for the default 64"))
	}
	if cfg.Shared != nil {
		for _, f := range []struct {
			name string
			set  bool
			got  any
		}{{"Rate", cfg.Rate != 0, cfg.Rate}, {"Burst", cfg.Burst != 0, cfg.Burst}, {"MaxKeys", cfg.MaxKeys != 0, cfg.MaxKeys}} {
			if f.set {
				errs = append(errs, invalid(f.name, f.got, "0 with Shared, whose fleet.LimiterConfig sets it"))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.Shared != nil {
		return &Limiter{name: cfg.Name, key: cfg.Key, v6bits: v6bits, obs: cfg.Observer, shared: cfg.Shared}, nil
	}
	n := 1
	for n < maxShards && n*2*minPerShard <= maxKeys {
		n *= 2
	}
	l := &Limiter{
		name:     cfg.Name,
		key:      cfg.Key,
		v6bits:   v6bits,
		limit:    rate.Limit(r),
		burst:    burst,
		perShard: maxKeys / n,
		mask:     uint64(n - 1),
		seed:     maphash.MakeSeed(),
		obs:      cfg.Observer,
		epoch:    time.Now(),
		shards:   make([]shard, n),
	}
	refill := math.Ceil(float64(burst) / r * float64(time.Second))
	l.refill = int64(min(refill, math.MaxInt64/2))
	for i := range l.shards {
		s := &l.shards[i]
		s.keys = make(map[uint64]*entry)
		s.lru.next, s.lru.prev = &s.lru, &s.lru
		s.over = rate.NewLimiter(l.limit, l.burst)
	}
	return l, nil
}

// invalid reports one invalid field, in the words of every guardrail
// package: "ratelimit: Config.Burst is -2; want ...". It Is
// ErrInvalidConfig.
func invalid(field string, got any, want string) error {
	return &configError{fmt.Sprintf("ratelimit: Config.%s is %v; want %s", field, got, want)}
}

type configError struct{ msg string }

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }

// clientPrefix is the client the default Config.Key charges a request
// from the peer address remote to: an IPv4 address (an IPv4-mapped IPv6
// one unmapped) as a /32, an IPv6 address as its prefix of v6bits, without
// its zone. remote is "ip:port", "[ip]:port", "ip" or "[ip]"; anything else
// is not an address (ok false). remote comes from the network or from code
// that copied it from a header: it is untrusted.
func clientPrefix(remote string, v6bits int) (netip.Prefix, bool) {
	a, ok := parseAddr(remote)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = v6bits
	}
	p, err := a.Prefix(bits)
	return p, err == nil
}

// parseAddr reads the IP address of remote: "ip:port", "[ip]:port", "ip"
// or "[ip]", with or without a zone (which it drops). The port is not
// read: it does not say who the client is. Neither a zone nor a string that
// cannot be an address costs an allocation.
func parseAddr(remote string) (netip.Addr, bool) {
	host := remote
	if strings.HasPrefix(remote, "[") {
		end := strings.IndexByte(remote, ']')
		if end < 0 || end+1 < len(remote) && remote[end+1] != ':' {
			return netip.Addr{}, false
		}
		host = remote[1:end]
	} else if i := strings.IndexByte(remote, ':'); i >= 0 && strings.IndexByte(remote[i+1:], ':') < 0 {
		host = remote[:i] // IPv4 and a port; an IPv6 address has two colons or more
	}
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i]
	}
	// The longest address is 45 bytes (ffff:...:255.255.255.255); looking
	// at the bytes first keeps junk away from the parser's error values.
	if len(host) == 0 || len(host) > 45 {
		return netip.Addr{}, false
	}
	for i := range len(host) {
		switch c := host[i]; {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F', c == '.', c == ':':
		default:
			return netip.Addr{}, false
		}
	}
	a, err := netip.ParseAddr(host)
	return a, err == nil
}

// addrHash is the table hash of the client of a request from remote, under
// the default Config.Key. Every remote that is not an address hashes alike.
func (l *Limiter) addrHash(remote string) uint64 {
	// One tag byte keeps an IPv4 client apart from the IPv6 prefix
	// ::ffff:a.b.c.d/128 and both apart from the shared bucket of
	// non-addresses.
	var b [17]byte
	if p, ok := clientPrefix(remote, l.v6bits); ok {
		b[0] = 6
		if p.Addr().Is4() {
			b[0] = 4
		}
		a := p.Addr().As16()
		copy(b[1:], a[:])
	}
	return maphash.Bytes(l.seed, b[:])
}

// Middleware returns a handler that charges each request to its key before
// calling next. A request over its key's rate is answered at once with 429
// Too Many Requests, a Retry-After header in whole seconds (at least 1, and
// never early: the same request sent after it is admitted, if the key sent
// nothing in between, nor, for a new key charged to the overflow bucket of
// a full table, any other such key) and no body; next does not run. A
// request whose Key fails is answered 400 Bad Request, also without
// running next.
func (l *Limiter) Middleware(next http.Handler) http.Handler {
	if l.shared != nil {
		return l.sharedMiddleware(next)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var h uint64
		if l.key == nil {
			h = l.addrHash(r.RemoteAddr)
		} else {
			key, err := l.key(r)
			if err != nil {
				l.observe(r.Context(), 0, err)
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			h = maphash.String(l.seed, key)
		}
		if wait, ok := l.allow(h, time.Now()); !ok {
			l.observe(r.Context(), wait, nil)
			chain.MarkNotProcessed(r.Context()) // next never runs
			w.Header()["Retry-After"] = retryAfterHeader(wait)
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Allow charges one request to key, for servers that are not HTTP; key is
// used as it is (an address is not grouped by its prefix). It returns nil
// when the request is admitted, or a *LimitedError (which Is ErrLimited)
// saying when to retry. Allow does not report to the Observer:
// the caller knows more about the request than the limiter does.
func (l *Limiter) Allow(key string) error {
	if l.shared != nil {
		wait, err := l.allowShared(context.Background(), key)
		if err == nil && wait > 0 {
			err = &LimitedError{RetryAfter: wait}
		}
		return err
	}
	if wait, ok := l.allow(maphash.String(l.seed, key), time.Now()); !ok {
		return &LimitedError{RetryAfter: wait}
	}
	return nil
}

// sharedMiddleware is Middleware with Config.Shared.
func (l *Limiter) sharedMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var key string
		if l.key == nil {
			key = l.addrKey(r.RemoteAddr)
		} else {
			var err error
			if key, err = l.key(r); err != nil {
				l.observe(r.Context(), 0, err)
				w.WriteHeader(http.StatusBadRequest)
				return
			}
		}
		wait, err := l.allowShared(r.Context(), key)
		switch {
		case err != nil:
			l.observe(r.Context(), 0, err)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case wait > 0:
			l.observe(r.Context(), wait, nil)
			w.Header()["Retry-After"] = retryAfterHeader(wait)
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// allowShared charges one request to key on the fleet limiter. A refusal
// is a wait of whole seconds, at least one, never shorter than the fleet
// limiter's; an error is what the fleet limiter returned that is not a
// refusal.
func (l *Limiter) allowShared(ctx context.Context, key string) (time.Duration, error) {
	err := l.shared.Allow(ctx, key)
	if err == nil {
		return 0, nil
	}
	var le *fleet.LimitedError
	if !errors.As(err, &le) {
		return 0, err
	}
	secs := min(max(math.Ceil(le.RetryAfter.Seconds()), 1), maxRetryAfter)
	return time.Duration(secs) * time.Second, nil
}

// addrKey is the fleet key of the client of a request from remote, under
// the default Config.Key: its prefix as text, or "-" when remote is not an
// address.
func (l *Limiter) addrKey(remote string) string {
	if p, ok := clientPrefix(remote, l.v6bits); ok {
		return p.String()
	}
	return "-"
}

func (l *Limiter) observe(ctx context.Context, wait time.Duration, err error) {
	if l.obs == nil {
		return
	}
	l.obs.Observe(ctx, event.Event{
		Kind:       event.Shed,
		Dependency: l.name,
		Operation:  event.Operation(ctx),
		Reason:     event.ReasonRateLimit,
		Delay:      wait,
		Err:        err,
	})
}

// allow charges one request to the key of hash h at now. When it refuses,
// wait is the Retry-After: whole seconds, at least one, after which the
// bucket holds a token again.
func (l *Limiter) allow(h uint64, now time.Time) (wait time.Duration, ok bool) {
	s := &l.shards[h&l.mask]
	clock := int64(now.Sub(l.epoch))
	s.mu.Lock()
	defer s.mu.Unlock()
	l.sweep(s, clock)
	var lim *rate.Limiter
	e := s.keys[h]
	if e == nil {
		e = l.insert(s, h, now)
	} else {
		e.unlink()
	}
	if e != nil {
		e.last = clock
		s.pushFront(e)
		lim = e.lim
	} else {
		lim = s.over
	}
	if lim.AllowN(now, 1) {
		return 0, true
	}
	// Refused: the reservation says when a token will be there; cancel it,
	// so that being refused costs the client nothing.
	res := lim.ReserveN(now, 1)
	d := res.DelayFrom(now)
	res.CancelAt(now)
	secs := int64(min(max(math.Ceil(d.Seconds()), 1), maxRetryAfter))
	// The rate package computes in floating point: make sure a token is
	// really there after the whole seconds, so that Retry-After is never
	// early.
	for secs < maxRetryAfter && lim.TokensAt(now.Add(time.Duration(secs)*time.Second)) < 1 {
		secs++
	}
	return time.Duration(secs) * time.Second, false
}

// insert adds a new key to s, or returns nil when s is full and none of its
// evictScan least recently seen keys has a full bucket: the key then uses
// s.over. A key whose bucket is full is dropped for the new one (and its
// entry and bucket reused: a full bucket is a new one); a bucket below full
// never is, or a client could reset its own by sending new keys. The
// caller holds s.mu.
func (l *Limiter) insert(s *shard, h uint64, now time.Time) *entry {
	if len(s.keys) < l.perShard {
		e := &entry{hash: h, lim: rate.NewLimiter(l.limit, l.burst)}
		s.keys[h] = e
		return e
	}
	e := s.lru.prev
	for range evictScan {
		if e == &s.lru {
			return nil
		}
		if e.lim.TokensAt(now) >= float64(l.burst) {
			e.unlink()
			delete(s.keys, e.hash)
			e.hash = h
			s.keys[h] = e
			return e
		}
		e = e.prev
	}
	return nil
}

// sweep drops up to two keys of s whose buckets have refilled since their
// last request, starting from the least recently seen: amortized, keys
// leave at least as fast as they come. The caller holds s.mu.
func (l *Limiter) sweep(s *shard, clock int64) {
	for range 2 {
		e := s.lru.prev
		if e == &s.lru || clock-e.last < l.refill {
			return
		}
		e.unlink()
		delete(s.keys, e.hash)
	}
}

func (s *shard) pushFront(e *entry) {
	e.prev, e.next = &s.lru, s.lru.next
	s.lru.next.prev = e
	s.lru.next = e
}

func (e *entry) unlink() {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// retryAfterValues holds the header values of the common waits, shared and
// never modified (cap == len, so an append elsewhere copies).
var retryAfterValues = func() (v [61][]string) {
	for i := 1; i < len(v); i++ {
		s := strconv.Itoa(i)
		v[i] = []string{s}[:1:1]
	}
	return v
}()

func retryAfterHeader(wait time.Duration) []string {
	secs := int64(wait / time.Second)
	if secs < int64(len(retryAfterValues)) {
		return retryAfterValues[max(secs, 1)]
	}
	return []string{strconv.FormatInt(secs, 10)}
}
