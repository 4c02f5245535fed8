package fallback

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrNoFallback means a call failed and no last-good value was young enough
// to serve in its place. The error Cache.Do returns then Is ErrNoFallback
// and wraps the call's error too, so errors.Is and errors.As work for both;
// its message is "fallback: no last-good value to serve: <call's error>".
var ErrNoFallback = errors.New("fallback: no last-good value to serve")

// CacheConfig configures a Cache. The zero value keeps up to 10,000 keys for
// a minute each and falls back on every error. A zero field means its
// default and a negative one is invalid: NewCache reports it by name.
// NewCache copies the config, so changing it later has no effect;
// ShouldFallback is called concurrently by the Cache's users.
type CacheConfig struct {
	// TTL is how long after it was stored a value may still be served as a
	// fallback: the staleness the business accepts (a price a minute old, a
	// profile an hour old). Older values are dropped, never served. Zero
	// means a minute.
	TTL time.Duration
	// MaxEntries bounds the number of keys; when full, the value stored
	// longest ago is evicted. Zero means 10,000.
	MaxEntries int
	// ShouldFallback reports whether a call's error may be answered with a
	// stale value. Nil means every error. Return false for errors that say
	// the value itself is gone or was never valid (not found, forbidden):
	// serving the last good copy would hide the truth.
	ShouldFallback func(err error) bool
}

// Cache keeps the last good value of each key for a TTL, so that when the
// call that produces it fails, the caller can answer with that value marked
// stale instead of an error, and never with an invented one: a price a
// minute old, shown as such, or a clear error, but never a price of 0.
//
// A Cache is bounded (CacheConfig.MaxEntries) and safe for concurrent use by
// multiple goroutines. It does not deduplicate concurrent calls for the same
// key. The zero Cache is not usable; create one with NewCache.
type Cache[K comparable, V any] struct {
	ttl       time.Duration
	max       int
	fallbackF func(error) bool

	mu      sync.Mutex
	entries map[K]*list.Element // of *entry[K, V]
	order   *list.List          // front: stored most recently
}

type entry[K comparable, V any] struct {
	key    K
	value  V
	stored time.Time
}

// Defaults of CacheConfig.
const (
	// defaultTTL is how long a value may be served as a fallback when
	// CacheConfig.TTL is zero.
	defaultTTL = time.Minute
	// defaultMaxEntries is the number of keys kept when
	// CacheConfig.MaxEntries is zero.
	defaultMaxEntries = 10_000
)

// ErrInvalidConfig is the sentinel of every error NewCache returns for a
// CacheConfig field that holds a value with no meaning.
var ErrInvalidConfig = errors.New("fallback: invalid config")

// configError reports one invalid field. It Is ErrInvalidConfig.
type configError struct{ msg string }

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }

// NewCache returns an empty Cache configured by c, or an error that Is
// ErrInvalidConfig and names every field of c that is invalid.
func NewCache[K comparable, V any](c CacheConfig) (*Cache[K, V], error) {
	var errs []error
	if c.TTL < 0 {
		errs = append(errs, &configError{fmt.Sprintf("fallback: CacheConfig.TTL is %v; want 0 (the default %v) or more", c.TTL, defaultTTL)})
	}
	if c.MaxEntries < 0 {
		errs = append(errs, &configError{fmt.Sprintf("fallback: CacheConfig.MaxEntries is %d; want 0 (the default %d) or more", c.MaxEntries, defaultMaxEntries)})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cache := &Cache[K, V]{
		ttl:       c.TTL,
		max:       c.MaxEntries,
		fallbackF: c.ShouldFallback,
		entries:   make(map[K]*list.Element),
		order:     list.New(),
	}
	if cache.ttl == 0 {
		cache.ttl = defaultTTL
	}
	if cache.max == 0 {
		cache.max = defaultMaxEntries
	}
	return cache, nil
}

// Result is the answer of Cache.Do: a fresh value, or the last good one
// marked Stale. It is a plain value, owned by the caller.
type Result[V any] struct {
	// Value is the call's result, or the last good value when Stale.
	Value V
	// Stale reports that the call failed and Value is the last good value.
	// Show it as such (a "prices may have changed" note, no checkout on a
	// stale price, a stale flag in the response).
	Stale bool
	// Age is how long ago a stale Value was stored; zero when fresh.
	Age time.Duration
	// Err is the call's error when Stale; nil when fresh.
	Err error
}

// Put stores v as the last good value of key, now.
func (c *Cache[K, V]) Put(key K, v V) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		e := el.Value.(*entry[K, V])
		e.value, e.stored = v, now
		c.order.MoveToFront(el)
		return
	}
	c.entries[key] = c.order.PushFront(&entry[K, V]{key: key, value: v, stored: now})
	for c.order.Len() > c.max {
		c.removeLocked(c.order.Back())
	}
}

// Get returns the last good value of key and its age. It reports false when
// there is none or it is older than the TTL.
func (c *Cache[K, V]) Get(key K) (v V, age time.Duration, ok bool) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[key]
	if !ok {
		return v, 0, false
	}
	e := el.Value.(*entry[K, V])
	age = now.Sub(e.stored)
	if age > c.ttl {
		c.removeLocked(el)
		return v, 0, false
	}
	return e.value, age, true
}

// Delete forgets key's last good value, for when it is known to be wrong.
func (c *Cache[K, V]) Delete(key K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		c.removeLocked(el)
	}
}

func (c *Cache[K, V]) removeLocked(el *list.Element) {
	delete(c.entries, el.Value.(*entry[K, V]).key)
	c.order.Remove(el)
}

// Do calls fn for key. On success it stores the value and returns it fresh.
// On failure it returns the last good value marked Stale, with a nil error,
// if one is younger than the TTL and ShouldFallback allows it; otherwise it
// returns an error that Is ErrNoFallback and wraps fn's error (or fn's
// error itself when ShouldFallback refuses) and a zero Result: a missing value is an error,
// never a made-up zero.
func (c *Cache[K, V]) Do(ctx context.Context, key K, fn func(context.Context) (V, error)) (Result[V], error) {
	v, err := fn(ctx)
	if err == nil {
		c.Put(key, v)
		return Result[V]{Value: v}, nil
	}
	if c.fallbackF != nil && !c.fallbackF(err) {
		return Result[V]{}, err
	}
	last, age, ok := c.Get(key)
	if !ok {
		return Result[V]{}, fmt.Errorf("%w: %w", ErrNoFallback, err)
	}
	return Result[V]{Value: last, Stale: true, Age: age, Err: err}, nil
}
