package redisfleet_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/extra/redisstore/internal/redistest"
	"github.com/guardrail-go/guardrail/extra/redisstore/redisfleet"
	"github.com/guardrail-go/guardrail/fleet"
)

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{}) // the cluster test's dead node fills the log otherwise
	goleak.VerifyTestMain(m)
}

// standalone returns a Store on the test Redis with a prefix of the
// test's own, and a client to look at its keys.
func standalone(t *testing.T) (*redisfleet.Store, *redis.Client, string) {
	t.Helper()
	addr := redistest.Addr(t)
	client := redistest.NewClient(t, addr, redis.Options{ContextTimeoutEnabled: true})
	prefix := redistest.Prefix(t, client)
	s, err := redisfleet.New(client, redisfleet.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return s, client, prefix
}

func TestNewErrors(t *testing.T) {
	if _, err := redisfleet.New(nil, redisfleet.Config{}); !errors.Is(err, redisfleet.ErrInvalidConfig) {
		t.Errorf("nil client: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	_, err := redisfleet.New(c, redisfleet.Config{Prefix: "a{b}:"})
	if !errors.Is(err, redisfleet.ErrInvalidConfig) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"ContextTimeoutEnabled", "Config.Prefix"} {
		if !containsString(err.Error(), want) {
			t.Errorf("the error does not name %s: %v", want, err)
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true})
	defer cc.Close()
	s, err := redisfleet.New(cc, redisfleet.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Key("client-7"); got != "guardrail:fleet:{client-7}" {
		t.Errorf("Key = %q", got)
	}
}

func containsString(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestTakeReturn(t *testing.T) {
	s, client, prefix := standalone(t)
	ctx := t.Context()
	const rate, burst = 0.001, 10 // no measurable refill during the test
	take := func(want, wantGot int) time.Duration {
		t.Helper()
		got, retry, err := s.Take(ctx, "k", want, rate, burst)
		if err != nil || got != wantGot {
			t.Fatalf("Take(%d) = %d, %v, %v; want %d", want, got, retry, err, wantGot)
		}
		return retry
	}
	take(4, 4) // a new key is a full bucket
	take(10, 6)
	if retry := take(1, 0); retry < 999*time.Second || retry > 1001*time.Second {
		t.Errorf("retry in %v, want 1000 s at 0.001/s", retry)
	}
	if err := s.Return(ctx, "k", 3, rate, burst); err != nil {
		t.Fatal(err)
	}
	take(5, 3)
	keys := client.Keys(ctx, prefix+"*").Val()
	if len(keys) != 1 || keys[0] != prefix+"{k}" {
		t.Fatalf("keys %q, want the one bucket %q", keys, prefix+"{k}")
	}
	if ttl := client.PTTL(ctx, keys[0]).Val(); ttl <= 0 || ttl > 10001*time.Second {
		t.Errorf("TTL %v, want the time to refill (10000 s) and a second", ttl)
	}
	// A full bucket is no key at all.
	if err := s.Return(ctx, "k", 100, rate, burst); err != nil {
		t.Fatal(err)
	}
	if n := client.Exists(ctx, prefix+"{k}").Val(); n != 0 {
		t.Errorf("a full bucket is still stored")
	}
	take(10, 10)
}

// The bucket refills on the server's clock.
func TestTakeRefills(t *testing.T) {
	s, _, _ := standalone(t)
	ctx := t.Context()
	const rate, burst = 1000, 50
	// A spent bucket says when its next token comes: at 1/s, within a
	// second, and no token comes back between two calls however slow the
	// machine.
	got, _, err := s.Take(ctx, "slow", 100, 1, burst)
	if err != nil || got != 50 {
		t.Fatalf("Take = %d, %v", got, err)
	}
	got, retry, err := s.Take(ctx, "slow", 1, 1, burst)
	if err != nil || got != 0 || retry <= 0 || retry > time.Second {
		t.Fatalf("got %d, retry %v, %v; want none, and a retry within 1 s at 1/s", got, retry, err)
	}
	if got, _, err = s.Take(ctx, "k", 100, rate, burst); err != nil || got != 50 {
		t.Fatalf("Take = %d, %v", got, err)
	}
	total := 0
	start := time.Now()
	for time.Since(start) < 100*time.Millisecond {
		n, _, err := s.Take(ctx, "k", 5, rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	el := time.Since(start)
	if max := int(el.Seconds()*rate) + 2; total > max || total < int(0.08*rate) {
		t.Errorf("took %d in %v, want at most %d", total, el, max)
	}
}

// A Redis that accepts and never answers costs a call its context's
// deadline, not go-redis's ReadTimeout.
func TestTakeBoundedByContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns sync.WaitGroup
	defer conns.Wait()
	conns.Go(func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	})
	client := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, Protocol: 2})
	defer client.Close()
	s, err := redisfleet.New(client, redisfleet.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err = s.Take(ctx, "k", 1, 10, 10)
	if err == nil {
		t.Fatal("Take against a silent server succeeded")
	}
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Errorf("Take took %v against a silent server, want about its 50 ms deadline", el)
	}
	ln.Close()
}

// offer runs one simulated process: rps requests a second to l for d,
// evenly, counting what is admitted and the slowest Allow.
func offer(l *fleet.Limiter, key string, rps float64, d time.Duration, admitted *atomic.Int64, slowest *atomic.Int64) {
	start := time.Now()
	sent := 0
	for time.Since(start) < d {
		due := int(time.Since(start).Seconds() * rps)
		for ; sent < due; sent++ {
			t0 := time.Now()
			err := l.Allow(context.Background(), key)
			if el := int64(time.Since(t0)); el > slowest.Load() {
				slowest.Store(el)
			}
			if err == nil {
				admitted.Add(1)
			}
		}
		time.Sleep(time.Millisecond) // the pace of the offered load
	}
}

// Four limiters, as four processes would, share one limit on Redis.
func TestLimiterOnRedis(t *testing.T) {
	s, _, _ := standalone(t)
	const rate, burst = 500, 50
	var lims []*fleet.Limiter
	for range 4 {
		l, err := fleet.NewLimiter(fleet.LimiterConfig{Store: s, Rate: rate, Burst: burst, Members: fleet.Fixed(4)})
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, l)
	}
	var admitted, slowest atomic.Int64
	const d = 2 * time.Second
	start := time.Now()
	var wg sync.WaitGroup
	for i, l := range lims {
		rps := 1500.0 / 6
		if i == 0 {
			rps = 750
		}
		wg.Go(func() { offer(l, "shared", rps, d, &admitted, &slowest) })
	}
	wg.Wait()
	el := time.Since(start)
	var takes, returns uint64
	for _, l := range lims {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		st := l.Stats()
		takes += st.Takes
		returns += st.Returns
		if st.StoreErrors != 0 {
			t.Errorf("store errors: %+v", st)
		}
	}
	a := admitted.Load()
	want := el.Seconds()*rate + burst
	t.Logf("admitted %d in %v (limit %.0f with the burst), %d takes, %d returns", a, el, want, takes, returns)
	if float64(a) > want*1.05 || float64(a) < want*0.85 {
		t.Errorf("admitted %d, want %.0f (-15%%, +5%%)", a, want)
	}
	if rt := float64(takes+returns) / float64(a); rt > 0.15 {
		t.Errorf("%.3f round trips per admitted request", rt)
	}
}
