package redisbus_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/redisstore/internal/redistest"
	"github.com/guardrail-go/guardrail/extra/redisstore/redisbus"
	"github.com/guardrail-go/guardrail/fleet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewRejectsNilClient(t *testing.T) {
	if _, err := redisbus.New(redisbus.Config{}); !errors.Is(err, redisbus.ErrInvalidConfig) || !strings.Contains(err.Error(), "Config.Client") {
		t.Fatalf("err = %v, want ErrInvalidConfig naming Config.Client", err)
	}
}

func TestEncodeDecode(t *testing.T) {
	at := time.UnixMilli(1764810000123)
	for _, h := range []fleet.Hint{
		{Dependency: "payments", Kind: fleet.HintPause, At: at, For: 10 * time.Second, Origin: "9f86d081884c7d65"},
		{Dependency: "ads.example.com:443", Kind: fleet.HintBreakerOpen, For: 1500 * time.Millisecond},
	} {
		got, ok := redisbus.Decode(redisbus.Encode(h))
		if !ok || got.Dependency != h.Dependency || got.Kind != h.Kind || !got.At.Equal(h.At) || got.For != h.For || got.Origin != h.Origin {
			t.Errorf("Decode(Encode(%+v)) = %+v, %v", h, got, ok)
		}
	}
	// For rounds up to the millisecond: a pause never becomes none.
	if got, ok := redisbus.Decode(redisbus.Encode(fleet.Hint{Dependency: "x", Kind: fleet.HintPause, For: time.Microsecond})); !ok || got.For != time.Millisecond {
		t.Errorf("a 1µs pause decodes as %v, %v; want 1ms", got.For, ok)
	}
	for _, bad := range []string{
		``, `null`, `[]`, `{}`, `{"v":2,"d":"x","k":1,"ms":1}`, `{"v":1,"d":"","k":1,"ms":1}`,
		`{"v":1,"d":"x","k":3,"ms":1}`, `{"v":1,"d":"x","k":1,"ms":0}`, `{"v":1,"d":"x","k":1,"ms":-5}`,
		`{"v":1,"d":"x","k":1,"ms":86400001}`, `{"v":1,"d":"x","k":1,"ms":1,"at":-1}`,
		`{"v":1,"d":"x","k":1,"ms":1e400}`, `{"v":1,"d":"x","k":256,"ms":1}`, `{"v":"1"}`,
		`{"v":1,"d":"` + strings.Repeat("x", 257) + `","k":1,"ms":1}`,
		`{"v":1,"d":"x","k":1,"ms":1,"pad":"` + strings.Repeat("x", redisbus.MaxMessage) + `"}`,
	} {
		if h, ok := redisbus.Decode([]byte(bad)); ok {
			t.Errorf("Decode(%.60q) = %+v, want it ignored", bad, h)
		}
	}
	if _, ok := redisbus.Decode([]byte(`{"v":1,"d":"x","k":1,"ms":1,"future":true}`)); !ok {
		t.Error("an unknown field made a hint invalid")
	}
}

// Whatever arrives on the channel, Decode does not panic, and what it
// accepts encodes back to the same hint.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"v":1,"d":"payments","k":1,"at":1764810000123,"ms":10000,"o":"9f86d081884c7d65"}`))
	f.Add([]byte(`{"v":1,"d":"x","k":2,"ms":1}`))
	f.Add([]byte(`{"v":1,"d":"x","k":1,"ms":1,"at":9007199254740992}`))
	f.Add([]byte(`{"v":1,"d":"\u0000","k":1,"ms":1}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, ok := redisbus.Decode(data)
		if !ok {
			return
		}
		if h.For <= 0 || h.Dependency == "" || (h.Kind != fleet.HintPause && h.Kind != fleet.HintBreakerOpen) {
			t.Fatalf("Decode accepted %+v", h)
		}
		again, ok := redisbus.Decode(redisbus.Encode(h))
		if !ok || again.Dependency != h.Dependency || again.Kind != h.Kind || !again.At.Equal(h.At) || again.For != h.For || again.Origin != h.Origin {
			t.Fatalf("Decode(Encode(%+v)) = %+v, %v", h, again, ok)
		}
	})
}

// newBus is a Bus on a channel of the test's own, on a client of its own.
func newBus(t *testing.T, addr, channel string, opts redis.Options) *redisbus.Bus {
	t.Helper()
	b, err := redisbus.New(redisbus.Config{Client: redistest.NewClient(t, addr, opts), Channel: channel})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// applied returns an Observer that signals each hint applied.
func applied() (event.Observer, <-chan event.Event) {
	ch := make(chan event.Event, 16)
	return event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.FleetHint && e.Reason == event.ReasonHintApplied {
			ch <- e
		}
		return ctx
	}), ch
}

func newHints(t *testing.T, bus fleet.Bus, obs event.Observer) *fleet.Hints {
	t.Helper()
	h, err := fleet.NewHints(fleet.HintsConfig{Bus: bus, Dependencies: []string{"payments"}, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	select {
	case <-h.Subscribed():
	case <-time.After(10 * time.Second):
		t.Fatal("not subscribed after 10 s")
	}
	return h
}

// A pause published by one process reaches another through Redis; a
// message on the channel that is not a hint is ignored.
func TestHintsThroughRedis(t *testing.T) {
	addr := redistest.Addr(t)
	channel := redistest.Prefix(t, redistest.NewClient(t, addr, redis.Options{})) + "hints"
	a := newHints(t, newBus(t, addr, channel, redis.Options{}), nil)
	obs, got := applied()
	b := newHints(t, newBus(t, addr, channel, redis.Options{}), obs)

	raw := redistest.NewClient(t, addr, redis.Options{})
	raw.Publish(context.Background(), channel, "garbage")
	raw.Publish(context.Background(), channel, `{"v":1,"d":"unknown","k":1,"ms":1000,"o":"x"}`)

	now := time.Now()
	a.RetryAfter("payments", 2*time.Second, now)
	select {
	case e := <-got:
		if e.Dependency != "payments" || e.Delay <= 0 || e.Delay > 2*time.Second {
			t.Fatalf("applied %+v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the hint did not arrive within 10 s")
	}
	if until, ok := b.Paused("payments", now); !ok || until.Sub(now) > 2*time.Second || until.Sub(now) < 1900*time.Millisecond {
		t.Fatalf("peer Paused = %v (%v from now), %v", until, until.Sub(now), ok)
	}
	if s := b.Stats(); s.Rejected != 1 || s.Applied != 1 {
		t.Fatalf("peer stats %+v: want the unknown name rejected, the garbage never delivered", s)
	}
	if s := a.Stats(); s.Applied != 0 {
		t.Fatalf("publisher stats %+v: its own hint came back and was applied", s)
	}
}

// When Redis drops the subscriber's connection, go-redis reconnects and
// subscribes again, and hints flow once more.
func TestResubscribesAfterConnectionLoss(t *testing.T) {
	addr := redistest.Addr(t)
	direct := redistest.NewClient(t, addr, redis.Options{})
	channel := redistest.Prefix(t, direct) + "hints"
	var mu sync.Mutex
	var ids []int64
	sub := newBus(t, addr, channel, redis.Options{OnConnect: func(ctx context.Context, cn *redis.Conn) error {
		id, err := cn.ClientID(ctx).Result()
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
		return err
	}})
	obs, got := applied()
	b := newHints(t, sub, obs)
	a := newHints(t, newBus(t, addr, channel, redis.Options{}), nil)

	mu.Lock()
	for _, id := range ids {
		if n, err := direct.ClientKillByFilter(context.Background(), "ID", strconv.FormatInt(id, 10)).Result(); err != nil || n != 1 {
			t.Fatalf("CLIENT KILL ID %d: %d, %v", id, n, err)
		}
	}
	killed := len(ids)
	mu.Unlock()
	if killed == 0 {
		t.Fatal("no connection of the subscriber's seen")
	}
	// Publish new pauses until one arrives: those published while the
	// subscription is down are lost, as pub/sub loses them.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for i := 1; ; i++ {
		select {
		case <-got:
			if _, ok := b.Paused("payments", time.Now()); !ok {
				t.Fatal("applied but not paused")
			}
			mu.Lock()
			defer mu.Unlock()
			if len(ids) <= killed {
				t.Fatal("a hint arrived without a new connection: the kill missed the subscription")
			}
			return
		case <-tick.C:
			a.RetryAfter("payments", 30*time.Second, time.Now().Add(time.Duration(i)*time.Hour)) // a new pause each time
		case <-deadline:
			t.Fatal("no hint after 20 s: the subscription did not come back")
		}
	}
}
