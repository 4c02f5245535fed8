package backoff_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/backoff"
)

const (
	base = 100 * time.Millisecond
	cap_ = 10 * time.Second
)

func TestExponentialCapsAndNeverOverflows(t *testing.T) {
	s := backoff.Exponential(base, cap_)
	tests := []struct {
		retry int
		want  time.Duration
	}{
		{-3, base},
		{0, base},
		{1, 200 * time.Millisecond},
		{6, 6400 * time.Millisecond},
		{7, cap_},
		{62, cap_},
		{63, cap_},
		{64, cap_},
		{1000, cap_},
		{math.MaxInt, cap_},
	}
	for _, tt := range tests {
		if got := s.Delay(tt.retry, 0, 0.5); got != tt.want {
			t.Errorf("Delay(%d) = %v, want %v", tt.retry, got, tt.want)
		}
	}
}

func TestAllStrategiesPositiveAndBoundedForHugeRetries(t *testing.T) {
	strategies := map[string]backoff.Strategy{
		"full":         backoff.FullJitter(base, cap_),
		"equal":        backoff.EqualJitter(base, cap_),
		"decorrelated": backoff.Decorrelated(base, cap_),
		"exponential":  backoff.Exponential(base, cap_),
		"hugebase":     backoff.FullJitter(time.Duration(math.MaxInt64/2), time.Duration(math.MaxInt64)),
	}
	for name, s := range strategies {
		prev := time.Duration(0)
		for _, retry := range []int{0, 1, 30, 61, 62, 63, 64, 100, 1000, math.MaxInt} {
			for _, u := range []float64{0, 0.5, 0.999999, 1, 2, -1, math.NaN(), math.Inf(1)} {
				d := s.Delay(retry, prev, u)
				if d < 0 {
					t.Fatalf("%s: Delay(%d, %v, %v) = %v, negative", name, retry, prev, u, d)
				}
				if name != "hugebase" && d > cap_ {
					t.Fatalf("%s: Delay(%d, %v, %v) = %v, above cap", name, retry, prev, u, d)
				}
				prev = d
			}
		}
	}
	// n = 1000 at the top of the draw must not wrap to zero.
	if d := backoff.FullJitter(base, cap_).Delay(1000, 0, 0.99); d < 9*time.Second {
		t.Fatalf("FullJitter(1000, u=0.99) = %v, want about 9.9s", d)
	}
}

// Full jitter must spread delays uniformly over [0, min(cap, base*2^n)), not
// cluster them: check the range, the mean and every decile bucket.
func TestFullJitterIsUniformOverTheWindow(t *testing.T) {
	s := backoff.FullJitter(base, cap_)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, retry := range []int{0, 3, 10} {
		top := min(cap_, base<<retry)
		const draws = 20000
		var buckets [10]int
		var sum float64
		for range draws {
			d := s.Delay(retry, 0, rng.Float64())
			if d < 0 || d >= top {
				t.Fatalf("retry %d: delay %v outside [0, %v)", retry, d, top)
			}
			buckets[int(float64(d)/float64(top)*10)]++
			sum += float64(d)
		}
		mean := sum / draws / float64(top)
		if math.Abs(mean-0.5) > 0.01 {
			t.Errorf("retry %d: mean %.3f of the window, want 0.5±0.01", retry, mean)
		}
		for i, n := range buckets {
			// expected 2000 per decile; 5 sigma is about ±212
			if n < 1780 || n > 2220 {
				t.Errorf("retry %d: decile %d holds %d of %d draws, want about 2000", retry, i, n, draws)
			}
		}
	}
}

func TestEqualJitterKeepsHalfTheWindow(t *testing.T) {
	s := backoff.EqualJitter(base, cap_)
	for _, u := range []float64{0, 0.25, 0.999} {
		d := s.Delay(2, 0, u)
		if d < 200*time.Millisecond || d >= 400*time.Millisecond {
			t.Errorf("EqualJitter(2, u=%v) = %v, want in [200ms, 400ms)", u, d)
		}
	}
}

func TestDecorrelatedGrowsFromPrevious(t *testing.T) {
	s := backoff.Decorrelated(base, cap_)
	if got := s.Delay(0, 0, 0); got != base {
		t.Errorf("first delay at u=0 = %v, want base", got)
	}
	if got := s.Delay(0, 0, 0.999999); got > 300*time.Millisecond || got < 299*time.Millisecond {
		t.Errorf("first delay at u→1 = %v, want about 3*base", got)
	}
	if got := s.Delay(5, time.Second, 0.5); got != 100*time.Millisecond+1450*time.Millisecond {
		t.Errorf("Delay(prev=1s, u=0.5) = %v, want 1.55s", got)
	}
	// 3*prev is above the cap: the draw spans [base, cap].
	if got, want := s.Delay(5, 8*time.Second, 0.99), 100*time.Millisecond+9801*time.Millisecond; got != want {
		t.Errorf("Delay(prev=8s, u=0.99) = %v, want %v", got, want)
	}
}

func TestConstantAndNone(t *testing.T) {
	if got := backoff.Constant(time.Second).Delay(9, 0, 0.3); got != time.Second {
		t.Errorf("Constant = %v", got)
	}
	if got := backoff.Constant(-time.Second).Delay(0, 0, 0.3); got != 0 {
		t.Errorf("Constant(negative) = %v, want 0", got)
	}
	if got := backoff.None().Delay(4, 0, 0.3); got != 0 {
		t.Errorf("None = %v", got)
	}
}

func TestZeroBaseAndCapMeanDefaults(t *testing.T) {
	s := backoff.FullJitter(0, 0)
	if got, want := s.Delay(20, 0, 0.5), backoff.DefaultCap/2; got != want {
		t.Errorf("FullJitter(0,0).Delay(20) = %v, want %v", got, want)
	}
	if got, want := s.Delay(0, 0, 0.5), backoff.DefaultBase/2; got != want {
		t.Errorf("FullJitter(0,0).Delay(0) = %v, want %v", got, want)
	}
}

func BenchmarkFullJitter(b *testing.B) {
	s := backoff.Default()
	var sink time.Duration
	for i := 0; b.Loop(); i++ {
		sink += s.Delay(i&15, sink, 0.5)
	}
	_ = sink
}

// FuzzDelay: for any window, retry number, previous delay and draw, every
// strategy's delay lies in [0, cap] (the window's cap after defaults), and
// never wraps.
func FuzzDelay(f *testing.F) {
	f.Add(int64(base), int64(cap_), 3, int64(0), 0.5)
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), math.MaxInt, int64(math.MaxInt64), 0.999999)
	f.Add(int64(-1), int64(1), -5, int64(-7), math.NaN())
	f.Add(int64(1), int64(math.MaxInt64/3+1), 61, int64(math.MaxInt64/3+1), 1.0)
	f.Fuzz(func(t *testing.T, b, c int64, retry int, prev int64, u float64) {
		for name, s := range map[string]backoff.Strategy{
			"full":         backoff.FullJitter(time.Duration(b), time.Duration(c)),
			"equal":        backoff.EqualJitter(time.Duration(b), time.Duration(c)),
			"decorrelated": backoff.Decorrelated(time.Duration(b), time.Duration(c)),
			"exponential":  backoff.Exponential(time.Duration(b), time.Duration(c)),
		} {
			// The largest delay the strategy gives is its cap: the
			// exponential delay of a retry past any overflow.
			top := backoff.Exponential(time.Duration(b), time.Duration(c)).Delay(math.MaxInt, 0, 0)
			d := s.Delay(retry, time.Duration(prev), u)
			if d < 0 || d > top {
				t.Fatalf("%s(%v, %v).Delay(%d, %v, %v) = %v; want within [0, %v]",
					name, time.Duration(b), time.Duration(c), retry, time.Duration(prev), u, d, top)
			}
		}
	})
}
