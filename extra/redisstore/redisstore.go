// Package redisstore is an idempotency.Store on Redis, shared by every
// instance that points at the same Redis.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
// Store is an idempotency.ScopedStore: BeginScoped counts each caller's
// live keys in a sorted set per caller, "<Prefix>{<scope>}" (the records'
// expiries as scores, trimmed by the script that reads it, with a Redis
// expiry of its own), checked and updated in the same script as the
// record, so the quota holds across every instance at no extra round
// trip.
//
// On a Redis Cluster (or a Ring, or any client but a *redis.Client) every
// call touches one hash slot: a record of Begin alone, or a caller's
// record and its count, both under the caller's hash tag,
// "<Prefix>{<scope>}<key>"; so one caller's records live on one node.
// Records written before BeginScoped existed are named "<Prefix><key>",
// and are not found by it: after an upgrade, a retry within TTL of a
// request answered by the old version runs again. On a single node
// (*redis.Client) records keep the name "<Prefix><key>" whether scoped or
// not, so an upgrade loses nothing. Do not put a hash tag in Prefix,
// which would put every record in one slot.
type Store struct {
	client   redis.Scripter
	prefix   string
	tagged   bool // a caller's records carry its hash tag (any client but a *redis.Client)
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
	_, single := client.(*redis.Client)
	return &Store{client: client, prefix: cfg.Prefix, tagged: !single, replicas: cfg.Replicas, waitMS: max(cfg.ReplicaTimeout.Milliseconds(), 1)}, nil
}

// run runs script on keys (one hash slot), then, if the Store waits for
// replicas and wrote (wrote reports it from the reply), WAIT on the same
// connection: WAIT counts the acknowledgements of that connection's
// writes.
func (s *Store) run(ctx context.Context, script *redis.Script, keys []string, wrote func(any) bool, args ...any) (any, error) {
	if s.replicas == 0 {
		return script.Run(ctx, s.client, keys, args...).Result()
	}
	key := keys[0]
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
				script.Eval(ctx, p, keys, args...)
			} else {
				script.EvalSha(ctx, p, keys, args...)
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

// The scripts work on KEYS[1], a record, and, when KEYS[2] is given, on
// the count of its caller's live keys: a sorted set of the caller's
// records by expiry (ms on the Redis clock), ARGV[#ARGV] naming the
// record in it. The count is trimmed of ended records before it is read,
// and expires with the last of them.
const scriptNow = `
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function count(ms)
  if KEYS[2] then
    redis.call('ZADD', KEYS[2], now() + ms, ARGV[#ARGV])
    if redis.call('PTTL', KEYS[2]) < ms then
      redis.call('PEXPIRE', KEYS[2], ms)
    end
  end
end
`

// beginScript takes the lock, or returns what holds the key; with a count
// whose live records number ARGV[3] or more (ARGV[3] not negative), it
// takes nothing and returns {0, ms until the first of them ends}.
var beginScript = redis.NewScript(scriptNow + `
local v = redis.call('GET', KEYS[1])
if v then
  return {v, redis.call('PTTL', KEYS[1])}
end
local ms = tonumber(ARGV[2])
if KEYS[2] then
  local t = now()
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', t)
  local quota = tonumber(ARGV[3])
  if quota >= 0 and redis.call('ZCARD', KEYS[2]) >= quota then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    local left = 0
    if first[2] then left = math.max(0, tonumber(first[2]) - t) end
    return {0, left}
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ms)
count(ms)
return 1
`)

// completeScript replaces the holder's lock with the response, if ARGV[1]
// is the holder's token.
var completeScript = redis.NewScript(scriptNow + `
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'L' or string.sub(v, 34) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], 'C' .. string.sub(v, 2, 33) .. ARGV[2], 'PX', ARGV[3])
count(tonumber(ARGV[3]))
return 1
`)

// releaseScript deletes the holder's lock, if ARGV[1] is the holder's token.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'L' or string.sub(v, 34) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if KEYS[2] then
  redis.call('ZREM', KEYS[2], ARGV[#ARGV])
end
return 1
`)

// extendScript sets the lock's expiry to ARGV[2] ms from now, if ARGV[1] is
// the holder's token. An expired lock is already gone (Redis deleted it),
// so it cannot be revived; a completed key has no token and keeps its TTL.
var extendScript = redis.NewScript(scriptNow + `
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'L' or string.sub(v, 34) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
count(tonumber(ARGV[2]))
return 1
`)

// names returns the Redis keys of key's record for a lock token (a
// caller's record and its count when the token says whose it is) and the
// arguments after args that the scripts then take.
func (s *Store) names(key, token string, args ...any) ([]string, []any) {
	scope, _, ok := strings.Cut(token, ".")
	if !ok {
		return []string{s.prefix + key}, args
	}
	count := s.prefix + "{" + scope + "}"
	if !s.tagged { // one node: keep the names Begin uses
		return []string{s.prefix + key, count}, append(args, key)
	}
	return []string{count + key, count}, append(args, key)
}

// validScope reports whether scope can name a hash tag and a token part.
func validScope(scope string) bool {
	if scope == "" || len(scope) > 128 {
		return false
	}
	for i := 0; i < len(scope); i++ {
		switch c := scope[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// Begin implements idempotency.Store.
func (s *Store) Begin(ctx context.Context, key string, fp idempotency.Fingerprint, lease time.Duration) (idempotency.Result, error) {
	return s.begin(ctx, idempotency.NewToken(), key, fp, lease, -1)
}

// BeginScoped implements idempotency.ScopedStore, in one round trip: the
// count of scope's live keys is checked and updated by the script that
// locks the key. scope is a caller ID of letters, digits, '-' and '_' (as
// idempotency.Keys passes); another is an error.
func (s *Store) BeginScoped(ctx context.Context, scope, key string, fp idempotency.Fingerprint, lease time.Duration, maxKeys int) (idempotency.Result, error) {
	if !validScope(scope) {
		return idempotency.Result{}, fmt.Errorf("redisstore: begin: scope %q; want 1 to 128 letters, digits, '-' or '_'", scope)
	}
	return s.begin(ctx, scope+"."+idempotency.NewToken(), key, fp, lease, maxKeys)
}

func (s *Store) begin(ctx context.Context, token, key string, fp idempotency.Fingerprint, lease time.Duration, maxKeys int) (idempotency.Result, error) {
	lock := make([]byte, 0, headerLen+len(token))
	lock = append(append(append(lock, tagLocked), fp[:]...), token...)
	keys, args := s.names(key, token, lock, millis(lease), maxKeys)
	reply, err := s.run(ctx, beginScript, keys, isOne, args...)
	if err != nil {
		if isOne(reply) { // the lock is taken but may not survive a failover: give it back
			rkeys, rargs := s.names(key, token, token)
			_, _ = releaseScript.Run(context.WithoutCancel(ctx), s.client, rkeys, rargs...).Result()
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
	if full, ok := pair[0].(int64); ok && full == 0 {
		left, _ := pair[1].(int64)
		return idempotency.Result{RetryIn: time.Duration(max(left, 0)) * time.Millisecond}, idempotency.ErrScopeFull
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
	keys, args := s.names(key, token, token, enc, millis(ttl))
	reply, err := s.run(ctx, completeScript, keys, isOne, args...)
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
	keys, args := s.names(key, token, token)
	n, err := releaseScript.Run(ctx, s.client, keys, args...).Int()
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
	keys, args := s.names(key, token, token, millis(lease))
	reply, err := s.run(ctx, extendScript, keys, isOne, args...)
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
