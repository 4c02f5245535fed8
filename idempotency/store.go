package idempotency

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"time"
)

// Errors a Store returns.
var (
	// ErrLockLost: Complete, Release or Extend was called with a token that
	// does not hold a live lock on the key: the lease expired (and another
	// request may have taken the key over), or the key was already completed
	// or released.
	ErrLockLost = errors.New("idempotency: lock not held")
	// ErrStoreFull: the store refused to lock a new key because it is at its
	// size limit and nothing could be evicted without losing a stored
	// response.
	ErrStoreFull = errors.New("idempotency: store full")
	// ErrScopeFull: a ScopedStore refused to lock a new key because the
	// caller's scope already holds its quota of live keys (see
	// Config.MaxKeysPerScope). The store is healthy, and other scopes are
	// not affected.
	ErrScopeFull = errors.New("idempotency: scope holds its quota of keys")
)

// ScopedStore is a Store that also bounds the keys each caller holds, so
// that one caller can never fill the store for the others. memstore,
// redisstore and pgstore implement it. Keys (and the HTTP middleware)
// call BeginScoped instead of Begin for every request that a caller is
// attributed to, and Begin only when there is one tenant; a Store that
// does not implement it bounds nothing per caller.
type ScopedStore interface {
	Store

	// BeginScoped is Begin for a key of scope, an opaque caller ID (32
	// hex characters, a hash of the caller). A scope holds at most
	// maxKeys live keys, in flight and completed, until they are released
	// or expire; negative maxKeys means no limit. When key is not live
	// (Begin would lock it) and scope already holds maxKeys keys, it takes
	// no lock and returns an error that Is ErrScopeFull, with
	// Result.RetryIn the time until the first of the scope's keys expires
	// (zero if unknown). A live key is answered as Begin answers it, even
	// when its scope is full. Complete, Release and Extend then work on
	// the key as after Begin, and keep the scope's count: a released or
	// expired key no longer counts. It must hold under concurrency across
	// every process sharing the store: concurrent calls never lock more
	// than maxKeys keys of one scope.
	BeginScoped(ctx context.Context, scope, key string, fp Fingerprint, lease time.Duration, maxKeys int) (Result, error)
}

// Store records which idempotency keys are in flight and which completed,
// with the response to replay. It is what lets a fleet of instances share
// keys: point every instance at the same Redis or PostgreSQL store.
//
// Implementations must be safe for concurrent use, and each method must be
// atomic with respect to the others on the same key, across every process
// sharing the store. Keys reach a Store already scoped and hashed by the
// middleware (64 hex characters), so a Store need not escape them.
type Store interface {
	// Begin looks key up and, when it is free (never seen, released, or
	// its lease or TTL expired), locks it for fp with a lease: the lock
	// frees itself after lease unless completed or released first. The
	// Result says which of the four cases happened; a fingerprint other
	// than the one the key was locked or completed with is StateMismatch,
	// whether in flight or completed. On error no lock is taken.
	Begin(ctx context.Context, key string, fp Fingerprint, lease time.Duration) (Result, error)

	// Complete stores resp for key, to be replayed for ttl, if token still
	// holds a live lock on key; otherwise it returns ErrLockLost and
	// changes nothing.
	Complete(ctx context.Context, key, token string, resp *Response, ttl time.Duration) error

	// Release frees key so that the next Begin locks it again, if token
	// still holds a live lock on key; otherwise it returns ErrLockLost and
	// changes nothing.
	Release(ctx context.Context, key, token string) error

	// Extend renews a lock: if token still holds a live lock on key, its
	// lease now ends lease from now (by the store's clock, as in Begin);
	// otherwise it returns ErrLockLost and changes nothing. A lease that
	// has ended is never revived, even if no other request took the key
	// over, and a completed key's TTL is never touched. The middleware
	// calls it periodically while a handler runs, so a handler slower than
	// its lease keeps its key.
	Extend(ctx context.Context, key, token string, lease time.Duration) error
}

// State is what Begin found. It is a plain value, safe to copy and share.
type State uint8

// The states Begin returns.
const (
	_ State = iota
	// StateAcquired: the key was free and is now locked; Result.Token holds
	// the lock. Run the request, then Complete or Release.
	StateAcquired
	// StateInFlight: another request holds the key with the same
	// fingerprint. Result.RetryIn is the time left on its lease.
	StateInFlight
	// StateCompleted: the key completed with the same fingerprint;
	// Result.Response is the stored response.
	StateCompleted
	// StateMismatch: the key is in flight or completed with another
	// fingerprint: the client reused a key for a different request.
	StateMismatch
)

var stateNames = [...]string{
	StateAcquired:  "acquired",
	StateInFlight:  "in_flight",
	StateCompleted: "completed",
	StateMismatch:  "mismatch",
}

// String returns the state's snake_case name.
func (s State) String() string {
	if int(s) < len(stateNames) && stateNames[s] != "" {
		return stateNames[s]
	}
	return "unknown"
}

// Result is what Store.Begin found. It is a plain value; its Response is
// shared with the store and must not be modified.
type Result struct {
	// State says which of the four cases Begin found.
	State State
	// Token proves ownership of the lock (StateAcquired only). It is random,
	// so a holder whose lease expired and was taken over cannot complete or
	// release the new holder's lock.
	Token string
	// Response is the stored response (StateCompleted only).
	Response *Response
	// RetryIn is the time left on the holder's lease (StateInFlight only).
	RetryIn time.Duration
}

// Response is a stored response: what a retry gets back. It is not safe
// for concurrent modification; stores copy or encode it in Complete.
type Response struct {
	// Status is the final status code (100-999).
	Status int
	// Header holds the stored header fields; nil when none.
	Header http.Header
	// Body is the response body; nil when empty or omitted.
	Body []byte
	// BodyOmitted reports that the original body was larger than the
	// middleware's MaxResponseBytes and was not stored; Body is empty.
	BodyOmitted bool
}

// Fingerprint identifies a request's payload (SHA-256 of method, path,
// query and body). The same key with another fingerprint is a client
// error. It is a plain value, safe to copy and share.
type Fingerprint [sha256.Size]byte

// String returns the fingerprint in hex.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// NewToken returns a random lock token (128 bits, hex). Stores use it in
// Begin.
func NewToken() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand: "Read ... never returns an error")
	return hex.EncodeToString(b[:])
}
