package redisstore_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/extra/redisstore"
	"github.com/guardrail-go/guardrail/extra/redisstore/internal/redistest"
	"github.com/guardrail-go/guardrail/fault/faulttest"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/storetest"
)

// middleware returns the Server's Middleware for a test with one caller.
func middleware(store idempotency.Store, cfg idempotency.Config) func(http.Handler) http.Handler {
	cfg.SingleTenant = true
	srv, err := idempotency.New(store, cfg)
	if err != nil {
		panic(err)
	}
	return srv.Middleware
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.Cleanup(redistest.StopShared)) }

// advanceScript shortens the expiry of KEYS by ARGV[1] ms, deleting those
// that end within it: the server's clock, moved forward for these keys.
// A caller's count (a sorted set by expiry) has its scores moved too.
var advanceScript = redis.NewScript(`
for _, k in ipairs(KEYS) do
  if redis.call('TYPE', k).ok == 'zset' then
    local m = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')
    for i = 1, #m, 2 do
      redis.call('ZADD', k, tonumber(m[i + 1]) - tonumber(ARGV[1]), m[i])
    end
  end
  local p = redis.call('PTTL', k)
  if p > 0 then
    if p <= tonumber(ARGV[1]) then
      redis.call('DEL', k)
    else
      redis.call('PEXPIRE', k, p - tonumber(ARGV[1]))
    end
  end
end
return 0
`)

func harness() storetest.Harness {
	return storetest.Harness{New: func(t *testing.T) storetest.Subject {
		addr := redistest.Addr(t)
		direct := redistest.NewClient(t, addr, redis.Options{})
		prefix := redistest.Prefix(t, direct)
		// The store reaches Redis through a proxy that the outage test cuts.
		// No client retries, so a cut is seen at once.
		proxy := faulttest.StartProxy(t, addr)
		client := redistest.NewClient(t, proxy.Addr(), redis.Options{MaxRetries: -1, DialTimeout: time.Second, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
		return storetest.Subject{
			Store: mustNew(client, redisstore.Config{Prefix: prefix}),
			Advance: func(d time.Duration) {
				ctx := context.Background()
				keys, err := direct.Keys(ctx, prefix+"*").Result()
				if err != nil {
					t.Fatal(err)
				}
				if len(keys) == 0 {
					return
				}
				if err := advanceScript.Run(ctx, direct, keys, strconv.FormatInt(d.Milliseconds(), 10)).Err(); err != nil {
					t.Fatal(err)
				}
			},
			Down: proxy.Down,
			Up:   func() { proxy.Up(t) },
		}
	}}
}

func TestConformance(t *testing.T) { storetest.Run(t, harness()) }

func TestHTTP(t *testing.T) { storetest.RunHTTP(t, harness()) }

// TestLeaseIsServerExpiry checks the lock and the response carry Redis
// expiries of the requested length: Redis, not a sweep, frees them.
func TestLeaseIsServerExpiry(t *testing.T) {
	addr := redistest.Addr(t)
	client := redistest.NewClient(t, addr, redis.Options{})
	prefix := redistest.Prefix(t, client)
	s := mustNew(client, redisstore.Config{Prefix: prefix})
	ctx := t.Context()
	res, err := s.Begin(ctx, "k", idempotency.Fingerprint{1}, 7*time.Second)
	if err != nil || res.State != idempotency.StateAcquired {
		t.Fatalf("Begin: %v %v", res.State, err)
	}
	if pttl := client.PTTL(ctx, prefix+"k").Val(); pttl <= 6*time.Second || pttl > 7*time.Second {
		t.Errorf("lock PTTL = %v, want about 7s", pttl)
	}
	if err := s.Complete(ctx, "k", res.Token, &idempotency.Response{Status: 200}, 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	if pttl := client.PTTL(ctx, prefix+"k").Val(); pttl <= 3*time.Hour-time.Minute || pttl > 3*time.Hour {
		t.Errorf("response PTTL = %v, want about 3h", pttl)
	}
}

func TestCorruptValue(t *testing.T) {
	addr := redistest.Addr(t)
	client := redistest.NewClient(t, addr, redis.Options{})
	prefix := redistest.Prefix(t, client)
	s := mustNew(client, redisstore.Config{Prefix: prefix})
	client.Set(t.Context(), prefix+"k", "garbage", time.Minute)
	if _, err := s.Begin(t.Context(), "k", idempotency.Fingerprint{}, time.Second); err == nil {
		t.Fatal("Begin on a foreign value succeeded")
	}
}

// mustNew is redisstore.New for a client that is never nil.
func mustNew(client redis.Scripter, cfg redisstore.Config) *redisstore.Store {
	s, err := redisstore.New(client, cfg)
	if err != nil {
		panic(err)
	}
	return s
}

func TestNewRefusesANilClient(t *testing.T) {
	if _, err := redisstore.New(nil, redisstore.Config{}); !errors.Is(err, redisstore.ErrInvalidConfig) {
		t.Fatalf("New(nil) err = %v, want ErrInvalidConfig", err)
	}
}

// BenchmarkScopedBegin measures a new key (lock, then release) without a
// quota (Begin) and with one (BeginScoped, the caller holding 1,000
// completed keys under a quota of 10,000): what the count per caller
// costs.
func BenchmarkScopedBegin(b *testing.B) { storetest.BenchmarkScopedBegin(b, benchStore(b)) }

func benchStore(b *testing.B) *redisstore.Store {
	direct := redistest.NewClient(b, redistest.Addr(b), redis.Options{})
	return mustNew(direct, redisstore.Config{Prefix: redistest.Prefix(b, direct)})
}

// TestScopedFindsRecordsOfBeginOnOneNode: on a single node a caller's
// records keep the names Begin gives them, so a response stored before
// the quota existed (by Begin) is replayed by BeginScoped after an
// upgrade, rather than run again.
func TestScopedFindsRecordsOfBeginOnOneNode(t *testing.T) {
	direct := redistest.NewClient(t, redistest.Addr(t), redis.Options{})
	s := mustNew(direct, redisstore.Config{Prefix: redistest.Prefix(t, direct)})
	ctx := t.Context()
	fp := idempotency.Fingerprint{1}
	res, err := s.Begin(ctx, "k", fp, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", res.Token, &idempotency.Response{Status: http.StatusCreated}, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err := s.BeginScoped(ctx, idempotency.NewToken(), "k", fp, time.Minute, 10)
	if err != nil || got.State != idempotency.StateCompleted || got.Response.Status != http.StatusCreated {
		t.Fatalf("BeginScoped after Begin stored the key: %v, %v; want the stored 201", got.State, err)
	}
}
