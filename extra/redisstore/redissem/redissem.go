// Package redissem keeps the slots of a fleet.Semaphore in Redis, so the
// processes of a fleet share one concurrency cap.
//
// Each semaphore is four keys and a channel, all named
// "<Prefix>{<name>}:…" so that one semaphore lives in one Cluster slot:
//
//   - "…:holders", a sorted set of the holders scored by the end of their
//     lease, in milliseconds of the server's clock (Redis TIME);
//   - "…:queue", a sorted set of the waiters scored by their ticket, so
//     they are served in arrival order;
//   - "…:places", a sorted set of the same waiters scored by the time their
//     place lapses unless they ask again;
//   - "…:ticket", the counter the tickets come from;
//   - "…:granted", the channel a script publishes to when it hands slots to
//     waiters, with their holder ids.
//
// Every call is one Lua script that reads the time on the server, drops
// the lapsed leases and places, and hands free slots to the head of the
// queue (for a third of the lease, until the waiter takes it) before it
// does its own work; so a crashed holder's slot comes back at the first
// call after its lease ends. Keys expire with the last lease or place
// they hold: an idle semaphore leaves nothing behind.
//
// A semaphore's name is its keys' hash tag, so it must not hold a "}";
// the Store's methods refuse one.
package redissem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/fleet"
)

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "guardrail:sem:"

// ErrInvalidConfig is the sentinel of every error New returns for a
// Config or client it rejects.
var ErrInvalidConfig = errors.New("redissem: invalid config")

// Config configures a Store. Its zero value is valid.
type Config struct {
	// Prefix is prepended to every key and channel, to share a Redis with
	// other data. Zero means DefaultPrefix. It must not hold a brace: the
	// semaphore's name is the keys' hash tag.
	Prefix string
}

// Store is a fleet.SemaphoreStore, and a fleet.SemaphoreNotifier, on a
// Redis server or Cluster. It is safe for concurrent use.
type Store struct {
	client redis.UniversalClient
	prefix string
}

var (
	_ fleet.SemaphoreStore    = (*Store)(nil)
	_ fleet.SemaphoreNotifier = (*Store)(nil)
)

// New returns a Store on client (a *redis.Client, a *redis.ClusterClient
// or another redis.UniversalClient), or an error that Is
// ErrInvalidConfig.
func New(client redis.UniversalClient, cfg Config) (*Store, error) {
	var errs []error
	if client == nil {
		errs = append(errs, fmt.Errorf("%w: the client is nil; want a *redis.Client, *redis.ClusterClient or another redis.UniversalClient", ErrInvalidConfig))
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("%w: Config.Prefix is %q; want no hash tag: the semaphore's name is the tag", ErrInvalidConfig, cfg.Prefix))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	return &Store{client: client, prefix: cfg.Prefix}, nil
}

// keys returns the semaphore's keys, in the order the scripts take them.
func (s *Store) keys(name string) []string {
	base := s.prefix + "{" + name + "}:"
	return []string{base + "holders", base + "queue", base + "places", base + "ticket"}
}

// channel names the channel grants of name are published on.
func (s *Store) channel(name string) string { return s.prefix + "{" + name + "}:granted" }

// prelude is the start of every script. KEYS: holders, queue, places,
// ticket. ARGV: channel, limit, lease in ms, then the script's own.
const prelude = `
local holders, queue, places, ticket = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])

-- promote drops lapsed leases and places, then hands free slots to the
-- head of the queue and publishes whom it handed them to.
local function promote()
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  local gone = redis.call('ZRANGEBYSCORE', places, '-inf', now)
  if #gone > 0 then
    redis.call('ZREM', queue, unpack(gone))
    redis.call('ZREM', places, unpack(gone))
  end
  local free = limit - redis.call('ZCARD', holders)
  if free <= 0 then return end
  local heads = redis.call('ZRANGE', queue, 0, free - 1)
  if #heads == 0 then return end
  for _, h in ipairs(heads) do
    redis.call('ZADD', holders, now + math.floor(ttl / 3), h) -- its Acquire takes the full lease
  end
  redis.call('ZREM', queue, unpack(heads))
  redis.call('ZREM', places, unpack(heads))
  redis.call('PUBLISH', ARGV[1], table.concat(heads, ' '))
end

-- tidy makes each key expire with the last lease or place it serves; the
-- ticket counter goes with the last waiter, as tickets only order waiters.
local function expireWith(key, scores)
  local last = redis.call('ZRANGE', scores, -1, -1, 'WITHSCORES')
  if #last > 0 then
    redis.call('PEXPIREAT', key, last[2])
  end
end
local function tidy()
  expireWith(holders, holders)
  expireWith(places, places)
  expireWith(queue, places)
  if redis.call('ZCARD', queue) == 0 then
    redis.call('DEL', ticket)
  else
    expireWith(ticket, places)
  end
end
`

// acquireScript: ARGV[4] is the holder. It returns {held, position,
// slots in use}.
var acquireScript = redis.NewScript(prelude + `
local holder = ARGV[4]
promote()
if redis.call('ZSCORE', holders, holder) or redis.call('ZCARD', holders) < limit then
  redis.call('ZADD', holders, now + ttl, holder)
  tidy()
  return {1, 0, redis.call('ZCARD', holders)}
end
if not redis.call('ZSCORE', queue, holder) then
  redis.call('ZADD', queue, redis.call('INCR', ticket), holder)
end
redis.call('ZADD', places, now + math.floor(ttl / 2), holder)
tidy()
return {0, redis.call('ZRANK', queue, holder), redis.call('ZCARD', holders)}
`)

// renewScript: ARGV[4:] are the holders. It returns the ones that held
// nothing.
var renewScript = redis.NewScript(prelude + `
promote()
local lost = {}
for i = 4, #ARGV do
  if redis.call('ZSCORE', holders, ARGV[i]) then
    redis.call('ZADD', holders, now + ttl, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
tidy()
return lost
`)

// releaseScript: ARGV[4] is the holder.
var releaseScript = redis.NewScript(prelude + `
redis.call('ZREM', holders, ARGV[4])
redis.call('ZREM', queue, ARGV[4])
redis.call('ZREM', places, ARGV[4])
promote()
tidy()
return 0
`)

func (s *Store) args(name string, limit int, ttl time.Duration, more ...string) []any {
	a := make([]any, 0, 3+len(more))
	a = append(a, s.channel(name), limit, max(ttl.Milliseconds(), 1))
	for _, m := range more {
		a = append(a, m)
	}
	return a
}

// checkName refuses a name that would break the keys' hash tag: with a
// "}" in it, the keys of one semaphore could land in different slots.
func checkName(name string) error {
	if strings.Contains(name, "}") {
		return fmt.Errorf("redissem: the semaphore name %q holds a }; want a name without one, so that it can be the keys' hash tag", name)
	}
	return nil
}

// Acquire implements fleet.SemaphoreStore.
func (s *Store) Acquire(ctx context.Context, name string, limit int, holder string, ttl time.Duration) (fleet.SemaphoreState, error) {
	if err := checkName(name); err != nil {
		return fleet.SemaphoreState{}, err
	}
	v, err := acquireScript.Run(ctx, s.client, s.keys(name), s.args(name, limit, ttl, holder)...).Int64Slice()
	if err != nil {
		return fleet.SemaphoreState{}, err
	}
	if len(v) != 3 {
		return fleet.SemaphoreState{}, fmt.Errorf("redissem: the acquire script returned %v; want 3 numbers", v)
	}
	return fleet.SemaphoreState{Held: v[0] == 1, Position: int(v[1]), InUse: int(v[2])}, nil
}

// Renew implements fleet.SemaphoreStore.
func (s *Store) Renew(ctx context.Context, name string, limit int, holders []string, ttl time.Duration) ([]string, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	return renewScript.Run(ctx, s.client, s.keys(name), s.args(name, limit, ttl, holders...)...).StringSlice()
}

// Release implements fleet.SemaphoreStore.
func (s *Store) Release(ctx context.Context, name string, limit int, holder string, ttl time.Duration) error {
	if err := checkName(name); err != nil {
		return err
	}
	return releaseScript.Run(ctx, s.client, s.keys(name), s.args(name, limit, ttl, holder)...).Err()
}

// Notify implements fleet.SemaphoreNotifier: it subscribes to the
// semaphore's channel, on a connection of its own, waiting for Redis to
// confirm no longer than ctx allows, and calls granted from one goroutine
// until stop. The client resubscribes after a lost
// connection; grants published meanwhile are missed, and the waiters'
// polls find them.
func (s *Store) Notify(ctx context.Context, name string, granted func(holder string)) (stop func(), err error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	ps := s.client.Subscribe(ctx, s.channel(name))
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		ps.Close()
		return nil, err
	}
	ch := ps.Channel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			for h := range strings.FieldsSeq(m.Payload) {
				granted(h)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			ps.Close()
			<-done
		})
	}, nil
}

// InUse returns the number of slots of name held, lapsed leases
// excluded, on the server's clock.
func (s *Store) InUse(ctx context.Context, name string) (int, error) {
	n, err := inUseScript.Run(ctx, s.client, s.keys(name)[:1]).Int()
	return n, err
}

var inUseScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
`)
