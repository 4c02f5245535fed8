package budget_test

import (
	"errors"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/budget"
)

// With the bucket starting at 10 tokens and each of 1000 original calls
// depositing 0.1, retries are held to 10 + 0.1*1000 = 110 where a client
// without a budget would send 3000.
func TestAmplificationBound(t *testing.T) {
	b := mustNew(budget.Config{})
	retries := 0
	for range 1000 {
		b.Deposit()
		for range 3 { // up to three retries per call
			if !b.TryRetry() {
				break
			}
			retries++
		}
	}
	if retries < 105 || retries > 111 {
		t.Fatalf("retries = %d, want about 110 (10 initial tokens + 0.1 x 1000)", retries)
	}
}

func TestStartsFullAndCaps(t *testing.T) {
	b := mustNew(budget.Config{Ratio: 0.5, Max: 3})
	if got := b.Tokens(); got != 3 {
		t.Fatalf("initial tokens = %v, want 3", got)
	}
	for range 10 {
		b.Deposit()
	}
	if got := b.Tokens(); got != 3 {
		t.Fatalf("tokens after deposits into a full bucket = %v, want 3", got)
	}
	for i := range 3 {
		if !b.TryRetry() {
			t.Fatalf("retry %d refused with %v tokens", i, b.Tokens())
		}
	}
	if b.TryRetry() {
		t.Fatal("retry granted from an empty bucket")
	}
	if got := b.Tokens(); got != 0 {
		t.Fatalf("a refused retry changed the bucket: %v tokens", got)
	}
	b.Deposit()
	if b.TryRetry() {
		t.Fatal("retry granted with 0.5 tokens")
	}
	b.Deposit()
	if !b.TryRetry() {
		t.Fatal("retry refused with 1 token")
	}
}

// Invalid values are rejected, each by name, rather than replaced.
func TestInvalidConfigIsRejected(t *testing.T) {
	for _, tc := range []struct {
		cfg  budget.Config
		want string
	}{
		{budget.Config{Ratio: -1, Max: -1}, "budget: Config.Ratio is -1; want a value in (0, 1000], or zero for the default\n" +
			"budget: Config.Max is -1; want a value in [1, 1e9], or zero for the default"},
		{budget.Config{Ratio: math.NaN()}, "budget: Config.Ratio is NaN; want a value in (0, 1000], or zero for the default"},
		{budget.Config{Ratio: 1001}, "budget: Config.Ratio is 1001; want a value in (0, 1000], or zero for the default"},
		{budget.Config{Max: math.Inf(1)}, "budget: Config.Max is +Inf; want a value in [1, 1e9], or zero for the default"},
		{budget.Config{Max: 0.2}, "budget: Config.Max is 0.2; want a value in [1, 1e9], or zero for the default"},
		{budget.Config{MinPerSecond: -1}, "budget: Config.MinPerSecond is -1; want a finite value of at least 0"},
		{budget.Config{MinPerSecond: math.NaN()}, "budget: Config.MinPerSecond is NaN; want a finite value of at least 0"},
	} {
		b, err := budget.New(tc.cfg)
		if b != nil || !errors.Is(err, budget.ErrInvalidConfig) || err.Error() != tc.want {
			t.Errorf("New(%+v) = %v, %v\nwant nil, %s", tc.cfg, b, err, tc.want)
		}
	}
	for _, cfg := range []budget.Config{{Ratio: 1000, Max: 1e9}, {Max: 1}, {MinPerSecond: 0.5}} {
		if _, err := budget.New(cfg); err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
		}
	}
}

func TestUnlimited(t *testing.T) {
	b := budget.Unlimited()
	for range 1000 {
		if !b.TryRetry() {
			t.Fatal("unlimited budget refused a retry")
		}
	}
	if !math.IsInf(b.Tokens(), 1) {
		t.Fatalf("Tokens = %v, want +Inf", b.Tokens())
	}
}

func TestMinPerSecondRefillsWithTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(budget.Config{Max: 2, MinPerSecond: 1})
		b.TryRetry()
		b.TryRetry()
		if b.TryRetry() {
			t.Fatal("retry granted from a drained bucket")
		}
		time.Sleep(500 * time.Millisecond)
		if b.TryRetry() {
			t.Fatal("half a second should earn half a token, not a retry")
		}
		time.Sleep(600 * time.Millisecond)
		if !b.TryRetry() {
			t.Fatalf("after 1.1s at 1/s the retry was refused (tokens %v)", b.Tokens())
		}
		time.Sleep(time.Hour)
		b.TryRetry()
		if got := b.Tokens(); got != 1 {
			t.Fatalf("after an hour: tokens %v, want capped at max 2 minus the one spent", got)
		}
	})
}

func TestWithoutRefillTimeChangesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(budget.Config{Max: 1})
		b.TryRetry()
		time.Sleep(time.Hour)
		if b.TryRetry() {
			t.Fatal("a budget without MinPerSecond refilled with time")
		}
	})
}

// Concurrent spenders never overdraw: exactly Max retries are granted from
// a full bucket no matter how many goroutines race.
func TestConcurrentSpendIsExact(t *testing.T) {
	b := mustNew(budget.Config{Max: 100})
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for range 8 {
		wg.Go(func() {
			n := 0
			for range 1000 {
				if b.TryRetry() {
					n++
				}
			}
			mu.Lock()
			granted += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if granted != 100 {
		t.Fatalf("granted %d retries from a bucket of 100", granted)
	}
}

func BenchmarkDeposit(b *testing.B) {
	bu := mustNew(budget.Config{})
	for b.Loop() {
		bu.Deposit()
	}
}

func BenchmarkDepositParallel(b *testing.B) {
	bu := mustNew(budget.Config{})
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bu.Deposit()
		}
	})
}

// Deposit and spend alternate, so the bucket is never full and every
// operation writes: the worst case for contention.
func BenchmarkDepositTryRetry(b *testing.B) {
	bu := mustNew(budget.Config{Ratio: 1})
	for b.Loop() {
		bu.Deposit()
		bu.TryRetry()
	}
}

func BenchmarkDepositTryRetryParallel(b *testing.B) {
	bu := mustNew(budget.Config{Ratio: 1})
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bu.Deposit()
			bu.TryRetry()
		}
	})
}

// mustNew is budget.New for configurations the test knows are valid.
func mustNew(cfg budget.Config) *budget.Budget {
	b, err := budget.New(cfg)
	if err != nil {
		panic(err)
	}
	return b
}

// A refill rate so large that the tokens earned overflow an int64 fills
// the bucket; it must not wrap negative and earn nothing.
func TestHugeMinPerSecondRefillsToMax(t *testing.T) {
	for _, rate := range []float64{1e12, 1e300, math.MaxFloat64} {
		synctest.Test(t, func(t *testing.T) {
			b := mustNew(budget.Config{Max: 3, MinPerSecond: rate})
			for b.TryRetry() {
			}
			time.Sleep(time.Hour)
			if !b.TryRetry() {
				t.Fatalf("MinPerSecond %g: retry refused after an hour", rate)
			}
			if got := b.Tokens(); got != 2 {
				t.Fatalf("MinPerSecond %g: tokens %v after an hour and one retry, want 2", rate, got)
			}
		})
	}
}

// FuzzRefill: whatever the rate and the time that passes, the tokens stay
// within [0, Max] and never fall while no retry is spent.
func FuzzRefill(f *testing.F) {
	f.Add(1.0, 2.0, int64(time.Second))
	f.Add(1e300, 10.0, int64(math.MaxInt64))
	f.Add(1e-300, 1.0, int64(1))
	f.Fuzz(func(t *testing.T, rate, maxTokens float64, elapsed int64) {
		if _, err := budget.New(budget.Config{Max: maxTokens, MinPerSecond: rate}); err != nil {
			return
		}
		synctest.Test(t, func(t *testing.T) {
			b, _ := budget.New(budget.Config{Max: maxTokens, MinPerSecond: rate})
			b.TryRetry()
			before := b.Tokens()
			time.Sleep(time.Duration(max(elapsed, 0) % int64(1000*time.Hour)))
			b.TryRetry()
			b.Deposit()
			if got := b.Tokens(); got < 0 || got > b.Max() || got < before-1 {
				t.Fatalf("rate %g max %g: tokens %v (before %v, max %v)", rate, maxTokens, got, before, b.Max())
			}
		})
	})
}

// Drain empties the bucket at once; deposits refill it as usual.
func TestDrain(t *testing.T) {
	b, err := budget.New(budget.Config{Ratio: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	b.Drain()
	if b.Tokens() != 0 || b.TryRetry() {
		t.Fatalf("drained: %v tokens, a retry granted; want 0, none", b.Tokens())
	}
	b.Deposit()
	b.Deposit()
	if !b.TryRetry() || b.TryRetry() {
		t.Fatal("two deposits at ratio 0.5 should buy exactly one retry")
	}
	u := budget.Unlimited()
	u.Drain()
	if !u.TryRetry() {
		t.Fatal("Drain on an Unlimited budget refused a retry")
	}
}
