// Package redisstore is an idempotency.Store on Redis, shared by every
// instance that points at the same Redis.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/idempotency"
)

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "guardrail:idem:"

// ErrCorrupt: a value under the store's prefix is not one the store wrote.
var ErrCorrupt = errors.New("redisstore: corrupt value")

// Config configures a Store; New copies it. The zero value is valid. A Config
// is a plain value, safe to share while nobody modifies it.
type Config struct {
	// Prefix is prepended to every key, to share a Redis with other data.
	// Empty means "guardrail:idem:".
	Prefix string
}

// Store is an idempotency.Store on Redis. It is safe for concurrent use.
//
// Each key is one Redis string with a native expiry, so Redis itself frees
// crashed holders' locks and expired responses; nothing needs sweeping. The
// lock is SET NX PX; completion, release and lease renewal (PEXPIRE) check
// the lock token and write in one Lua script, so each call is one atomic
// round trip and works on a Redis Cluster (one key per call). A Redis that persists its data (RDB or
// AOF) keeps stored responses across a restart; one that does not forgets
// them, and a retry after the restart runs again.
// Run Redis with maxmemory-policy noeviction (its default): every key here
// has an expiry, so an evicting policy may drop a live lock or a stored
// response under memory pressure, and a retry would then run again.
type Store struct {
	client redis.Scripter
	prefix string
}

// New returns a Store using client, which may be a *redis.Client,
// *redis.ClusterClient, *redis.Ring or any redis.UniversalClient. The caller
// keeps ownership of client and closes it. A nil client is an error that
// Is ErrInvalidConfig.
func New(client redis.Scripter, cfg Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: the client is nil; want a *redis.Client, *redis.ClusterClient or another redis.Scripter", ErrInvalidConfig)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	return &Store{client: client, prefix: cfg.Prefix}, nil
}

// ErrInvalidConfig is the sentinel of New's errors.
var ErrInvalidConfig = errors.New("redisstore: invalid configuration")

// The value of a key is a tag byte, the 32-byte fingerprint, then the lock
// token ('L', in flight) or the encoded response ('C', completed).
const (
	tagLocked    = 'L'
	tagCompleted = 'C'
	headerLen    = 1 + len(idempotency.Fingerprint{})
)

// beginScript takes the lock with SET NX PX, or returns what holds the key.
var beginScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
`)

// completeScript replaces the holder's lock with the response, if ARGV[1]
// is the holder's token.
var completeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'L' or string.sub(v, 34) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], 'C' .. string.sub(v, 2, 33) .. ARGV[2], 'PX', ARGV[3])
return 1
`)

// releaseScript deletes the holder's lock, if ARGV[1] is the holder's token.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'L' or string.sub(v, 34) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
`)

// extendScript sets the lock's expiry to ARGV[2] ms from now, if ARGV[1] is
// the holder's token. An expired lock is already gone (Redis deleted it),
// so it cannot be revived; a completed key has no token and keeps its TTL.
var extendScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'L' or string.sub(v, 34) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// Begin implements idempotency.Store.
func (s *Store) Begin(ctx context.Context, key string, fp idempotency.Fingerprint, lease time.Duration) (idempotency.Result, error) {
	token := idempotency.NewToken()
	lock := make([]byte, 0, headerLen+len(token))
	lock = append(append(append(lock, tagLocked), fp[:]...), token...)
	reply, err := beginScript.Run(ctx, s.client, []string{s.prefix + key}, lock, millis(lease)).Result()
	if err != nil {
		return idempotency.Result{}, fmt.Errorf("redisstore: begin: %w", err)
	}
	if n, ok := reply.(int64); ok && n == 1 {
		return idempotency.Result{State: idempotency.StateAcquired, Token: token}, nil
	}
	pair, ok := reply.([]any)
	if !ok || len(pair) != 2 {
		return idempotency.Result{}, fmt.Errorf("%w: unexpected script reply %T", ErrCorrupt, reply)
	}
	v, _ := pair[0].(string)
	pttl, _ := pair[1].(int64)
	if len(v) < headerLen || v[1:headerLen] != string(fp[:]) {
		if len(v) < headerLen || (v[0] != tagLocked && v[0] != tagCompleted) {
			return idempotency.Result{}, fmt.Errorf("%w: key %s", ErrCorrupt, key)
		}
		return idempotency.Result{State: idempotency.StateMismatch}, nil
	}
	switch v[0] {
	case tagLocked:
		return idempotency.Result{State: idempotency.StateInFlight, RetryIn: time.Duration(max(pttl, 0)) * time.Millisecond}, nil
	case tagCompleted:
		resp := new(idempotency.Response)
		if err := resp.UnmarshalBinary([]byte(v[headerLen:])); err != nil {
			return idempotency.Result{}, fmt.Errorf("%w: key %s: %w", ErrCorrupt, key, err)
		}
		return idempotency.Result{State: idempotency.StateCompleted, Response: resp}, nil
	}
	return idempotency.Result{}, fmt.Errorf("%w: key %s", ErrCorrupt, key)
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	enc, err := resp.MarshalBinary()
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	n, err := completeScript.Run(ctx, s.client, []string{s.prefix + key}, token, enc, millis(ttl)).Int()
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if n != 1 {
		return idempotency.ErrLockLost
	}
	return nil
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, key, token string) error {
	n, err := releaseScript.Run(ctx, s.client, []string{s.prefix + key}, token).Int()
	if err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	if n != 1 {
		return idempotency.ErrLockLost
	}
	return nil
}

// Extend implements idempotency.Store in one round trip.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	n, err := extendScript.Run(ctx, s.client, []string{s.prefix + key}, token, millis(lease)).Int()
	if err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	if n != 1 {
		return idempotency.ErrLockLost
	}
	return nil
}

// millis formats d for PX, at least 1 ms (PX refuses 0).
func millis(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10)
}
