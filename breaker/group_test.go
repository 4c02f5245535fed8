package breaker_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/event"
)

func TestGroupCreatesPerKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		g := mustGroup(breaker.GroupConfig{
			Config: breaker.Config{MinRequests: 1, Observer: r},
			ConfigFor: func(key string) breaker.Config {
				cfg := breaker.Config{MinRequests: 1, Observer: r}
				if key == "eu-west" {
					cfg.MinRequests = 100 // a busier region
				}
				return cfg
			},
		})
		us, eu := g.Get("us-east"), g.Get("eu-west")
		if us == eu || g.Get("us-east") != us || breaker.GroupLen(g) != 2 {
			t.Fatal("Get must return one breaker per key")
		}
		calls(us, breaker.Failure, 1)
		calls(eu, breaker.Failure, 1)
		wantState(t, us, breaker.Open)
		wantState(t, eu, breaker.Closed) // its own config
		if ts := r.list(); len(ts) != 1 || ts[0].Dependency != "us-east" {
			t.Fatalf("transitions %+v, want one for us-east", ts)
		}
		if n := us.Config().Name; n != "us-east" {
			t.Fatalf("Config().Name = %q", n)
		}
	})
}

func TestGroupBoundedWithManyKeys(t *testing.T) {
	const max = 100
	g := mustGroup(breaker.GroupConfig{MaxKeys: max})
	hot := g.Get("hot")
	for i := range 10000 {
		g.Get("user-" + strconv.Itoa(i)) // a high-cardinality key, by mistake
		if got := breaker.GroupLen(g); got > max {
			t.Fatalf("after %d keys the group holds %d, want at most %d", i+1, got, max)
		}
		if g.Get("hot") != hot {
			t.Fatalf("the key used all along was dropped after %d new keys", i+1)
		}
	}
	if got := breaker.GroupLen(g); got != max {
		t.Fatalf("Len = %d, want %d", got, max)
	}
}

// Under pressure an open breaker is kept while there are closed ones to
// drop: forgetting it would send calls to a dependency known to be down.
func TestGroupPrefersKeepingOpenBreakers(t *testing.T) {
	g := mustGroup(breaker.GroupConfig{MaxKeys: 10, Config: breaker.Config{MinRequests: 1}})
	down := g.Get("down")
	calls(down, breaker.Failure, 1)
	wantState(t, down, breaker.Open)
	forced := g.Get("maintenance")
	forced.ForceOpen()
	for i := range 1000 {
		g.Get(strconv.Itoa(i))
	}
	var keys []string
	g.Range(func(key string, b *breaker.Breaker) bool {
		if b.State() == breaker.Open {
			keys = append(keys, key)
		}
		return true
	})
	if len(keys) != 2 {
		t.Fatalf("open breakers kept: %v, want down and maintenance", keys)
	}
	if g.Get("down") != down || g.Get("maintenance") != forced {
		t.Fatal("open breakers were replaced")
	}
}

func TestGroupIdleTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = time.Minute
		g := mustGroup(breaker.GroupConfig{IdleTTL: ttl, Config: breaker.Config{MinRequests: 1, OpenFor: time.Hour}})
		active, idle, down := g.Get("active"), g.Get("idle"), g.Get("down")
		calls(down, breaker.Failure, 1)

		time.Sleep(ttl)
		g.Get("active")
		g.Get("new-1") // checks: every key was created since the start
		time.Sleep(ttl)
		g.Get("active")
		g.Get("new-2") // checks: idle and down unused since the last check
		if breaker.GroupLen(g) != 4 {
			var keys []string
			g.Range(func(k string, _ *breaker.Breaker) bool { keys = append(keys, k); return true })
			t.Fatalf("group holds %v, want active, down (still open), new-1 and new-2", keys)
		}
		if g.Get("active") != active || g.Get("down") != down {
			t.Fatal("an active or open breaker was dropped")
		}
		if g.Get("idle") == idle {
			t.Fatal("the idle breaker was kept")
		}
	})
}

func TestGroupNeverIdleSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := mustGroup(breaker.GroupConfig{IdleTTL: -1})
		a := g.Get("a")
		time.Sleep(24 * time.Hour)
		g.Get("b")
		time.Sleep(24 * time.Hour)
		g.Get("c")
		if g.Get("a") != a || breaker.GroupLen(g) != 3 {
			t.Fatal("a negative IdleTTL must never drop idle breakers")
		}
	})
}

func TestGroupRange(t *testing.T) {
	g := mustGroup(breaker.GroupConfig{})
	for _, k := range []string{"a", "b", "c"} {
		g.Get(k)
	}
	n := 0
	g.Range(func(key string, b *breaker.Breaker) bool {
		if b.Config().Name != key {
			t.Fatalf("Range gave %q -> %q", key, b.Config().Name)
		}
		n++
		return false // stops
	})
	if n != 1 || breaker.GroupLen(g) != 3 {
		t.Fatalf("Range visited %d, Len %d; want 1 and 3", n, breaker.GroupLen(g))
	}
}

func TestGroupConcurrent(t *testing.T) {
	const max = 50
	g := mustGroup(breaker.GroupConfig{MaxKeys: max, Config: breaker.Config{MinRequests: 5}})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 1500 {
				b := g.Get("k" + strconv.Itoa((w*7919+i)%200))
				if p, err := b.Allow(); err == nil {
					p.Done(breaker.Outcome(i%3), 0)
				}
				if i%100 == 0 {
					g.Range(func(string, *breaker.Breaker) bool { return true })
				}
			}
		})
	}
	wg.Wait()
	if got := breaker.GroupLen(g); got > max {
		t.Fatalf("Len = %d, want at most %d", got, max)
	}
}

// The Observer of GroupConfig.Config sees the transitions of every
// breaker of the group, named by key.
func TestGroupObserver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var got []string
		g := mustGroup(breaker.GroupConfig{Config: breaker.Config{MinRequests: 1,
			Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
				got = append(got, e.Dependency+":"+e.To)
				return ctx
			}),
		}})
		calls(g.Get("eu"), breaker.Failure, 1)
		calls(g.Get("us"), breaker.Failure, 1)
		if s := strings.Join(got, " "); s != "eu:open us:open" {
			t.Fatalf("delivered %q", s)
		}
	})
}

// The idle sweep of a large group advances a bounded step at each new key
// and, once done, has dropped exactly the idle keys, as a sweep of the
// whole group at once would.
func TestGroupIdleSweepIsIncremental(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl, n = time.Minute, 5000
		g := mustGroup(breaker.GroupConfig{IdleTTL: ttl, MaxKeys: 2 * n})
		for i := range n {
			g.Get("k" + strconv.Itoa(i))
		}
		time.Sleep(ttl)
		g.Get("start-1") // starts a sweep: every key was created since the start
		for i := range 100 {
			g.Get("a" + strconv.Itoa(i)) // finishes it
		}
		if got := breaker.GroupLen(g); got != n+101 {
			t.Fatalf("Len = %d after the first sweep, want %d: nothing was idle", got, n+101)
		}
		time.Sleep(ttl)
		for i := 0; i < n; i += 2 {
			g.Get("k" + strconv.Itoa(i)) // the even keys stay in use
		}
		g.Get("start-2") // starts the second sweep
		if got := breaker.GroupLen(g); got < n {
			t.Fatalf("Len = %d right after the sweep started, want the sweep not done at once", got)
		}
		for i := range 100 {
			g.Get("b" + strconv.Itoa(i))
		}
		if got, want := breaker.GroupLen(g), n/2+202; got != want {
			t.Fatalf("Len = %d after the second sweep, want %d (the even keys and those created since the first sweep)", got, want)
		}
		held := map[string]bool{}
		g.Range(func(k string, _ *breaker.Breaker) bool { held[k] = true; return true })
		for i := range n {
			if k := "k" + strconv.Itoa(i); held[k] != (i%2 == 0) {
				t.Fatalf("%s held = %v", k, held[k])
			}
		}
	})
}
