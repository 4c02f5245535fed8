// Package memstore is an in-memory idempotency.Store for a single instance:
// the embedded default, bounded in entries and bytes.
package memstore

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail/idempotency"
)

// Defaults used for zero Config fields.
const (
	DefaultMaxEntries = 100_000
	DefaultMaxBytes   = 64 << 20
)

// Config bounds a Store; New copies it. The zero value is valid. A Config
// is a plain value, safe to share while nobody modifies it.
type Config struct {
	// MaxEntries caps the keys held, in flight and completed. Zero means
	// 100,000; a negative value is invalid.
	MaxEntries int
	// MaxBytes caps the approximate memory held by keys and stored
	// responses. Zero means 64 MiB; a negative value is invalid (a store
	// in process memory without a bound would grow with the rate of keyed
	// requests times the TTL until the process runs out of memory).
	MaxBytes int64
}

// Store is an idempotency.Store in process memory. It is safe for concurrent
// use. Keys are shared by the handlers of one process only: a fleet of
// instances needs redisstore or pgstore.
//
// Expired leases and responses are evicted as the store is used (every call
// first drops what has expired, oldest first), so it needs no background
// goroutine and no Close. When full of live entries it does not evict
// stored responses early, since that would let a retry run twice: Begin
// refuses new keys with idempotency.ErrStoreFull (the middleware answers
// 503) until entries expire, and a response that does not fit is stored
// without its body (idempotency.Response.BodyOmitted). Size the limits for
// TTL times the rate of keyed requests.
//
// Store is an idempotency.ScopedStore: it counts each caller's live keys,
// so that the middleware's per-caller quota (MaxKeysPerScope) keeps one
// caller from filling it for the others; keep MaxEntries well above that
// quota. Stored bodies never take the last eighth of MaxBytes, which stays
// for locking new keys: a store full of one caller's large responses
// still takes other callers' keys (their responses are then stored
// without their bodies until space frees).
type Store struct {
	maxEntries int
	maxBytes   int64

	mu      sync.Mutex
	entries map[string]*entry    // guarded by mu
	expiry  expiryHeap           // guarded by mu; every entry, soonest expiry first
	bytes   int64                // guarded by mu; sum of entry.size
	scopes  map[string]*scopeUse // guarded by mu; by scope, for BeginScoped
}

type entry struct {
	key     string
	scope   string // "" when begun without one
	fp      idempotency.Fingerprint
	token   string                // lock holder; "" once completed
	resp    *idempotency.Response // nil while in flight
	expires time.Time             // lease end, then TTL end
	size    int64
	index   int // in expiry
}

// entryOverhead approximates the map slot, heap slot and struct.
const entryOverhead = 160

// ErrInvalidConfig is the sentinel of every error New returns for a Config
// it rejects.
var ErrInvalidConfig = errors.New("memstore: invalid config")

// configError reports an invalid field. It Is ErrInvalidConfig.
type configError struct{ msg string }

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }

// New returns an empty Store. It returns an error that Is ErrInvalidConfig,
// naming the field, when cfg holds a negative limit.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.MaxEntries < 0:
		return nil, &configError{fmt.Sprintf("memstore: Config.MaxEntries is %d; want a positive count, or 0 for %d", cfg.MaxEntries, DefaultMaxEntries)}
	case cfg.MaxBytes < 0:
		return nil, &configError{fmt.Sprintf("memstore: Config.MaxBytes is %d; want a positive size in bytes, or 0 for %d", cfg.MaxBytes, DefaultMaxBytes)}
	}
	s := &Store{
		maxEntries: cfg.MaxEntries,
		maxBytes:   cfg.MaxBytes,
		entries:    make(map[string]*entry),
		scopes:     make(map[string]*scopeUse),
	}
	if s.maxEntries == 0 {
		s.maxEntries = DefaultMaxEntries
	}
	if s.maxBytes == 0 {
		s.maxBytes = DefaultMaxBytes
	}
	return s, nil
}

// Begin implements idempotency.Store. A returned Response is shared and must
// not be modified.
func (s *Store) Begin(ctx context.Context, key string, fp idempotency.Fingerprint, lease time.Duration) (idempotency.Result, error) {
	return s.begin(ctx, "", key, fp, lease, -1)
}

// BeginScoped implements idempotency.ScopedStore: scope's live entries
// are counted, and its new keys refused with idempotency.ErrScopeFull once
// it holds maxKeys of them. A returned Response is shared and must not be
// modified.
func (s *Store) BeginScoped(ctx context.Context, scope, key string, fp idempotency.Fingerprint, lease time.Duration, maxKeys int) (idempotency.Result, error) {
	return s.begin(ctx, scope, key, fp, lease, maxKeys)
}

func (s *Store) begin(ctx context.Context, scope, key string, fp idempotency.Fingerprint, lease time.Duration, maxKeys int) (idempotency.Result, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.Result{}, err
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evict(now)
	if e, ok := s.entries[key]; ok {
		switch {
		case e.fp != fp:
			return idempotency.Result{State: idempotency.StateMismatch}, nil
		case e.resp != nil:
			return idempotency.Result{State: idempotency.StateCompleted, Response: e.resp}, nil
		}
		return idempotency.Result{State: idempotency.StateInFlight, RetryIn: e.expires.Sub(now)}, nil
	}
	if u := s.scopes[scope]; scope != "" && maxKeys >= 0 && u.len() >= maxKeys {
		var retryIn time.Duration
		if first := u.soonest(); !first.IsZero() {
			retryIn = first.Sub(now)
		}
		return idempotency.Result{RetryIn: retryIn}, idempotency.ErrScopeFull
	}
	e := &entry{key: key, scope: scope, fp: fp, token: idempotency.NewToken(), expires: now.Add(lease)}
	e.size = entryOverhead + int64(len(key)+len(scope)+len(e.token))
	if len(s.entries) >= s.maxEntries || s.bytes+e.size > s.maxBytes {
		return idempotency.Result{}, idempotency.ErrStoreFull
	}
	s.entries[key] = e
	heap.Push(&s.expiry, e)
	s.bytes += e.size
	if scope != "" {
		u := s.scopes[scope]
		if u == nil {
			u = &scopeUse{entries: make(map[*entry]struct{})}
			s.scopes[scope] = u
		}
		u.entries[e] = struct{}{}
		u.first = time.Time{}
	}
	return idempotency.Result{State: idempotency.StateAcquired, Token: e.token}, nil
}

// Complete implements idempotency.Store. It keeps its own copy of resp.
func (s *Store) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.held(ctx, now, key, token)
	if err != nil {
		return err
	}
	stored := copyResponse(resp)
	size := entryOverhead + int64(len(key)+len(e.scope)) + responseSize(stored)
	if stored.Body != nil && s.bytes-e.size+size > s.maxBytes-s.maxBytes/8 {
		// Keep the completion, which is what prevents a second run, and
		// give up the body rather than the key. Bodies never take the
		// last eighth, so that a store full of them still locks new keys.
		stored.Body, stored.BodyOmitted = nil, true
		size = entryOverhead + int64(len(key)+len(e.scope)) + responseSize(stored)
	}
	s.bytes += size - e.size
	e.size, e.resp, e.token, e.expires = size, stored, "", now.Add(ttl)
	heap.Fix(&s.expiry, e.index)
	s.moved(e)
	return nil
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, key, token string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.held(ctx, time.Now(), key, token)
	if err != nil {
		return err
	}
	s.remove(e)
	return nil
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.held(ctx, now, key, token)
	if err != nil {
		return err
	}
	e.expires = now.Add(lease)
	heap.Fix(&s.expiry, e.index)
	s.moved(e)
	return nil
}

// held returns key's entry if token holds its live lock, after evicting
// what expired by now. The caller holds s.mu.
func (s *Store) held(ctx context.Context, now time.Time, key, token string) (*entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.evict(now)
	e, ok := s.entries[key]
	if !ok || e.resp != nil || e.token != token {
		return nil, idempotency.ErrLockLost
	}
	return e, nil
}

// Len returns the number of live keys, in flight and completed.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evict(time.Now())
	return len(s.entries)
}

// Bytes returns the approximate memory held by live keys and responses.
func (s *Store) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evict(time.Now())
	return s.bytes
}

// evict drops every entry expired at now. The caller must hold s.mu.
func (s *Store) evict(now time.Time) {
	for len(s.expiry) > 0 && !s.expiry[0].expires.After(now) {
		s.remove(s.expiry[0])
	}
}

// remove drops e. The caller must hold s.mu.
func (s *Store) remove(e *entry) {
	heap.Remove(&s.expiry, e.index)
	delete(s.entries, e.key)
	s.bytes -= e.size
	if u := s.scopes[e.scope]; u != nil {
		delete(u.entries, e)
		u.first = time.Time{}
		if len(u.entries) == 0 {
			delete(s.scopes, e.scope)
		}
	}
}

// moved records that e's expiry changed. The caller must hold s.mu.
func (s *Store) moved(e *entry) {
	if u := s.scopes[e.scope]; u != nil {
		u.first = time.Time{}
	}
}

// scopeUse is what a scope holds. Its fields are guarded by Store.mu.
type scopeUse struct {
	entries map[*entry]struct{} // the scope's live entries
	// first caches the soonest expiry of entries, zero when unknown: a
	// caller over its quota sending new keys then costs one scan of its
	// entries (at most the quota) until one of them changes, not one per
	// request, under the lock every caller shares.
	first time.Time
}

func (u *scopeUse) len() int {
	if u == nil {
		return 0
	}
	return len(u.entries)
}

// soonest returns the soonest expiry of u's entries, zero if none.
func (u *scopeUse) soonest() time.Time {
	if u == nil {
		return time.Time{}
	}
	if u.first.IsZero() {
		for e := range u.entries {
			if u.first.IsZero() || e.expires.Before(u.first) {
				u.first = e.expires
			}
		}
	}
	return u.first
}

func copyResponse(r *idempotency.Response) *idempotency.Response {
	c := &idempotency.Response{Status: r.Status, Header: r.Header.Clone(), BodyOmitted: r.BodyOmitted}
	if len(r.Body) > 0 {
		c.Body = append([]byte(nil), r.Body...)
	}
	return c
}

func responseSize(r *idempotency.Response) int64 {
	n := int64(len(r.Body)) + 32
	for k, vs := range r.Header {
		n += int64(len(k)) + 16
		for _, v := range vs {
			n += int64(len(v)) + 16
		}
	}
	return n
}

// expiryHeap orders entries by expiry, soonest first.
type expiryHeap []*entry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expires.Before(h[j].expires) }
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *expiryHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
