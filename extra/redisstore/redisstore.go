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
	// Replicas, if positive, makes every write (taking a lock, storing a
	// response, renewing a lease) wait until that many replicas of the key's master have
	// acknowledged it (Redis WAIT), so that a failover promoting one of
	// them keeps it. Redis replicates asynchronously: without this, a
	// master that dies right after a write may take it with it, and the
	// retry that follows runs the handler a second time. A write that is
	// not acknowledged within ReplicaTimeout fails (Begin's error makes the
	// request fail without running the handler). Release does not wait: a
	// lost release only keeps the key locked until its lease ends. It costs
	// a round trip to a replica per write. Zero means do not wait; a negative value is
	// invalid. It needs a *redis.Client or a *redis.ClusterClient.
	Replicas int
	// ReplicaTimeout bounds the wait for Replicas. Zero means
	// DefaultReplicaTimeout (1s); negative is invalid (a wait without
	// limit would hang every request while a replica is down).
	ReplicaTimeout time.Duration
}

// DefaultReplicaTimeout is the wait for replicas when
// Config.ReplicaTimeout is zero.
const DefaultReplicaTimeout = time.Second

// ErrNotReplicated: a write was not acknowledged by Config.Replicas
// replicas in time. The write was made on the master, and may or may not
// survive a failover.
var ErrNotReplicated = errors.New("redisstore: write not acknowledged by enough replicas")

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
//
// On a Redis Cluster each idempotency record is one key, so every call
// touches one hash slot and needs no hash tag; do not put a hash tag in
// Prefix, which would put every record in one slot.
type Store struct {
	client   redis.Scripter
	prefix   string
	replicas int
	waitMS   int64
}

// New returns a Store using client, which may be a *redis.Client,
// *redis.ClusterClient, *redis.Ring or any redis.UniversalClient. The caller
// keeps ownership of client and closes it. A nil client is an error that
// Is ErrInvalidConfig.
func New(client redis.Scripter, cfg Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: the client is nil; want a *redis.Client, *redis.ClusterClient or another redis.Scripter", ErrInvalidConfig)
	}
	var errs []error
	if cfg.Replicas < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.Replicas is %d; want a count of replicas, or zero not to wait", ErrInvalidConfig, cfg.Replicas))
	}
	if cfg.ReplicaTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.ReplicaTimeout is %v; want a positive duration, or zero for the default", ErrInvalidConfig, cfg.ReplicaTimeout))
	}
	if cfg.Replicas > 0 {
		switch client.(type) {
		case *redis.Client, *redis.ClusterClient:
		default:
			errs = append(errs, fmt.Errorf("%w: Config.Replicas is %d with a %T; want a *redis.Client or *redis.ClusterClient, which can send WAIT to the key's master", ErrInvalidConfig, cfg.Replicas, client))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.ReplicaTimeout == 0 {
		cfg.ReplicaTimeout = DefaultReplicaTimeout
	}
	return &Store{client: client, prefix: cfg.Prefix, replicas: cfg.Replicas, waitMS: max(cfg.ReplicaTimeout.Milliseconds(), 1)}, nil
}

// run runs script on key, then, if the Store waits for replicas and wrote
// (wrote reports it from the reply), WAIT on the same connection: WAIT
// counts the acknowledgements of that connection's writes.
func (s *Store) run(ctx context.Context, script *redis.Script, key string, wrote func(any) bool, args ...any) (any, error) {
	if s.replicas == 0 {
		return script.Run(ctx, s.client, []string{key}, args...).Result()
	}
	var node *redis.Client
	switch c := s.client.(type) {
	case *redis.Client:
		node = c
	case *redis.ClusterClient:
		var err error
		if node, err = c.MasterForKey(ctx, key); err != nil {
			return nil, err
		}
	}
	var reply any
	var wait *redis.Cmd
	for _, eval := range []bool{false, true} { // EVALSHA, then EVAL if the node lacks the script
		cmds, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			if eval {
				script.Eval(ctx, p, []string{key}, args...)
			} else {
				script.EvalSha(ctx, p, []string{key}, args...)
			}
			wait = p.Do(ctx, "WAIT", s.replicas, s.waitMS)
			return nil
		})
		if err != nil && !eval && redis.HasErrorPrefix(cmds[0].Err(), "NOSCRIPT") {
			continue
		}
		if err = cmds[0].Err(); err != nil {
			if c, ok := s.client.(*redis.ClusterClient); ok {
				// The node may be down or no longer the slot's master (a
				// failover): let the next call find the slot's master anew.
				// A reload is cheap and runs at most every 200ms.
				c.ReloadState(ctx)
			}
			return nil, err
		}
		reply = cmds[0].(*redis.Cmd).Val()
		break
	}
	if wrote(reply) {
		n, err := wait.Int64()
		if err != nil {
			return nil, err
		}
		if n < int64(s.replicas) {
			return reply, fmt.Errorf("%w: %d of %d within %dms", ErrNotReplicated, n, s.replicas, s.waitMS)
		}
	}
	return reply, nil
}

func isOne(reply any) bool { n, ok := reply.(int64); return ok && n == 1 }

// ErrInvalidConfig is the sentinel of New's errors.
var ErrInvalidConfig = errors.New("redisstore: invalid config")

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
	reply, err := s.run(ctx, beginScript, s.prefix+key, isOne, lock, millis(lease))
	if err != nil {
		if isOne(reply) { // the lock is taken but may not survive a failover: give it back
			_, _ = releaseScript.Run(context.WithoutCancel(ctx), s.client, []string{s.prefix + key}, token).Result()
		}
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
	reply, err := s.run(ctx, completeScript, s.prefix+key, isOne, token, enc, millis(ttl))
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if !isOne(reply) {
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
	reply, err := s.run(ctx, extendScript, s.prefix+key, isOne, token, millis(lease))
	if err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	if !isOne(reply) {
		return idempotency.ErrLockLost
	}
	return nil
}

// millis formats d for PX, at least 1 ms (PX refuses 0).
func millis(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10)
}
