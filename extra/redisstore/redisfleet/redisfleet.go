// Package redisfleet is a fleet.TokenStore on Redis: the token bucket per
// key that a fleet.Limiter in every process leases its tokens from, so a
// rate limit holds across every process that points at the same Redis.
//
// Each Take and Return is one Lua script, one round trip, evaluated
// atomically on the server against the server's clock (Redis TIME), so the
// processes' clocks need not agree. A bucket is one hash under
// "<Prefix>{<key>}": the hash tag puts each limit in one slot of a Redis
// Cluster, and the hash expires once the bucket would be full again (a
// full bucket is what a key Redis does not have means), so idle keys cost
// nothing.
package redisfleet

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/fleet"
)

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "guardrail:fleet:"

// ErrInvalidConfig is the sentinel of New's errors.
var ErrInvalidConfig = errors.New("redisfleet: invalid config")

// ErrCorrupt: a reply of the script is not what the script returns, such
// as when something else runs under the store's prefix.
var ErrCorrupt = errors.New("redisfleet: unexpected reply")

// Config configures a Store; New copies it. The zero value is valid.
type Config struct {
	// Prefix is prepended to every key, to share a Redis with other
	// data. Empty means DefaultPrefix, "guardrail:fleet:". It must not
	// hold a '{' or a '}', which would change the key's hash tag.
	Prefix string
}

// Store is a fleet.TokenStore on Redis. It is safe for concurrent use.
//
// Every call is bounded by its context's deadline, which the
// fleet.Limiter sets (LimiterConfig.StoreTimeout): that is why New wants
// a client whose options say ContextTimeoutEnabled, without which go-redis
// waits for its own ReadTimeout (3 s by default) instead.
//
// Redis replicates asynchronously: a failover to a replica that missed the
// last writes forgets the last takes, and the fleet may over-admit what
// those took, at most a lease (LimiterConfig.MaxLease) per process taken
// just before the failover. Run Redis with maxmemory-policy noeviction
// (its default), or an evicted bucket is a full one.
type Store struct {
	client redis.Scripter
	prefix string
}

var _ fleet.TokenStore = (*Store)(nil)

// New returns a Store using client: a *redis.Client, *redis.ClusterClient,
// *redis.Ring or any redis.UniversalClient. The caller keeps ownership of
// client and closes it. A nil client, a client created without
// ContextTimeoutEnabled, or a Prefix with a brace, is an error that Is
// ErrInvalidConfig.
func New(client redis.Scripter, cfg Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: the client is nil; want a *redis.Client, *redis.ClusterClient or another redis.UniversalClient", ErrInvalidConfig)
	}
	var errs []error
	if !contextTimeouts(client) {
		errs = append(errs, fmt.Errorf("%w: the %T was created without ContextTimeoutEnabled; want its options to set ContextTimeoutEnabled: true, so that a call ends at the limiter's StoreTimeout", ErrInvalidConfig, client))
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("%w: Config.Prefix is %q; want a prefix without '{' or '}', which would change every key's hash tag", ErrInvalidConfig, cfg.Prefix))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	return &Store{client: client, prefix: cfg.Prefix}, nil
}

// contextTimeouts reports whether client ends its calls at their
// context's deadline; a client whose options it cannot read is trusted.
func contextTimeouts(client redis.Scripter) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// Key returns the Redis key of key's bucket: "<Prefix>{<key>}".
func (s *Store) Key(key string) string { return s.prefix + "{" + key + "}" }

// bucketScript runs a take (ARGV[1] > 0: up to that many tokens) or a
// return (ARGV[1] < 0: that many tokens back) on the bucket KEYS[1] of
// rate ARGV[2] tokens a second and size ARGV[3]. The bucket is a hash of
// t, the tokens, and a, the server's clock in µs when t was counted; a
// missing bucket is full. It returns {tokens taken, µs until the bucket
// holds a whole token again, 0 if it still does}.
var bucketScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local n = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local tokens = burst
local v = redis.call('HMGET', KEYS[1], 't', 'a')
if v[1] and v[2] then
  tokens = tonumber(v[1])
  local at = tonumber(v[2])
  if now > at then
    tokens = math.min(burst, tokens + (now - at) * rate / 1000000)
  else
    now = at -- a clock behind the last write's (a failover): count from it
  end
end
local got, retry = 0, 0
if n > 0 then
  got = math.min(n, math.floor(tokens))
  tokens = tokens - got
  if tokens < 1 then
    retry = math.max(math.min(math.ceil((1 - tokens) * 1000000 / rate), 4e15), 1)
  end
else
  tokens = math.min(burst, tokens - n)
end
if tokens >= burst then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 'a', string.format('%.17g', now))
  local ms = math.min(math.ceil((burst - tokens) * 1000 / rate) + 1000, 4e12)
  redis.call('PEXPIRE', KEYS[1], ms)
end
return {got, retry}
`)

// Take takes up to want tokens of key's bucket; see fleet.TokenStore.
func (s *Store) Take(ctx context.Context, key string, want int, rate float64, burst int) (int, time.Duration, error) {
	if want < 1 {
		return 0, 0, fmt.Errorf("redisfleet: Take of %d tokens; want at least 1", want)
	}
	got, retry, err := s.run(ctx, key, want, rate, burst)
	if err != nil {
		return 0, 0, err
	}
	if got < 0 || got > int64(want) || retry < 0 || (got == 0 && retry == 0) {
		return 0, 0, fmt.Errorf("%w: took %d of %d tokens, retry in %dµs", ErrCorrupt, got, want, retry)
	}
	return int(got), time.Duration(retry) * time.Microsecond, nil
}

// Return puts n tokens back in key's bucket; see fleet.TokenStore.
func (s *Store) Return(ctx context.Context, key string, n int, rate float64, burst int) error {
	if n < 1 {
		return nil
	}
	_, _, err := s.run(ctx, key, -n, rate, burst)
	return err
}

func (s *Store) run(ctx context.Context, key string, n int, rate float64, burst int) (got, retry int64, err error) {
	if !(rate > 0) || burst < 1 {
		return 0, 0, fmt.Errorf("redisfleet: rate %v and burst %d; want both above 0", rate, burst)
	}
	reply, err := bucketScript.Run(ctx, s.client, []string{s.Key(key)},
		n, strconv.FormatFloat(rate, 'g', -1, 64), burst).Int64Slice()
	if err != nil {
		if errors.Is(err, redis.Nil) {
			err = fmt.Errorf("%w: nil", ErrCorrupt)
		}
		return 0, 0, err
	}
	if len(reply) != 2 {
		return 0, 0, fmt.Errorf("%w: %d values", ErrCorrupt, len(reply))
	}
	return reply[0], reply[1], nil
}
