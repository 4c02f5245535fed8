// Package backoff computes the delays between retries.
//
// A Strategy is a pure function of the retry number, the previous delay and a
// uniform random draw supplied by the caller, so simulations and tests that
// pass their own seeded draws are exactly reproducible, and concurrent callers
// share nothing.
package backoff

import (
	"math"
	"time"
)

// Defaults of FullJitter as used by guardrail.Policy: a first retry within
// 100 ms, so a blip costs little, and no wait above 10 s, so that a retry
// still fits a caller's deadline.
const (
	DefaultBase = 100 * time.Millisecond
	DefaultCap  = 10 * time.Second
)

// Strategy computes the delay before a retry. Implementations must be pure
// and safe for concurrent use.
//
// retry is the number of retries already made: 0 before the first retry.
// prev is the delay returned for the previous retry (0 before the first).
// u is a uniform random draw in [0, 1); values outside are clamped.
// The result is never negative.
type Strategy interface {
	Delay(retry int, prev time.Duration, u float64) time.Duration
}

// Default returns full jitter with base 100 ms and cap 10 s, the strategy
// guardrail uses when a Policy names none.
func Default() Strategy { return FullJitter(DefaultBase, DefaultCap) }

// None retries at once.
func None() Strategy { return Constant(0) }

// Constant waits d before every retry. A negative d is treated as 0.
func Constant(d time.Duration) Strategy { return constant(max(d, 0)) }

type constant time.Duration

func (c constant) Delay(int, time.Duration, float64) time.Duration { return time.Duration(c) }

// Exponential waits min(cap, base*2^retry), with no jitter: every client that
// failed together retries together. Prefer FullJitter; this exists for
// comparison and for single clients.
func Exponential(base, cap time.Duration) Strategy {
	return exponential{norm(base, cap)}
}

// EqualJitter waits t/2 + u*t/2 where t = min(cap, base*2^retry): never less
// than half the exponential delay, so it spreads clients over half the window.
func EqualJitter(base, cap time.Duration) Strategy {
	return equalJitter{norm(base, cap)}
}

// FullJitter waits u*t where t = min(cap, base*2^retry): uniform over the
// whole window, so that clients which failed at the same moment do not
// retry in lockstep. It does the least total work under contention (AWS
// Architecture Blog, "Exponential Backoff And Jitter"). A zero base means
// DefaultBase; a zero cap means DefaultCap.
func FullJitter(base, cap time.Duration) Strategy {
	return fullJitter{norm(base, cap)}
}

// Decorrelated waits min(cap, base + u*(3*prev - base)), with prev = base
// before the first retry: each delay grows from the last one drawn rather
// than from the retry number.
func Decorrelated(base, cap time.Duration) Strategy {
	return decorrelated{norm(base, cap)}
}

// window holds a validated base and cap.
type window struct{ base, cap time.Duration }

func norm(base, cap time.Duration) window {
	if base <= 0 {
		base = DefaultBase
	}
	if cap <= 0 {
		cap = DefaultCap
	}
	if cap < base {
		cap = base
	}
	return window{base, cap}
}

// exp returns min(cap, base*2^retry) without overflow for any retry.
func (w window) exp(retry int) time.Duration {
	if retry <= 0 {
		return min(w.base, w.cap)
	}
	if retry >= 62 || w.base > w.cap>>uint(retry) {
		return w.cap
	}
	return w.base << uint(retry)
}

func clamp(u float64) float64 {
	if !(u > 0) { // also NaN
		return 0
	}
	if u >= 1 {
		return math.Nextafter(1, 0)
	}
	return u
}

// scale returns u*d, for d >= 0.
func scale(d time.Duration, u float64) time.Duration {
	return time.Duration(float64(d) * clamp(u))
}

type exponential struct{ window }

func (s exponential) Delay(retry int, _ time.Duration, _ float64) time.Duration {
	return s.exp(retry)
}

type equalJitter struct{ window }

func (s equalJitter) Delay(retry int, _ time.Duration, u float64) time.Duration {
	t := s.exp(retry)
	return t/2 + scale(t-t/2, u)
}

type fullJitter struct{ window }

func (s fullJitter) Delay(retry int, _ time.Duration, u float64) time.Duration {
	return scale(s.exp(retry), u)
}

type decorrelated struct{ window }

func (s decorrelated) Delay(_ int, prev time.Duration, u float64) time.Duration {
	if prev < s.base {
		prev = s.base
	}
	hi := s.cap
	if prev <= s.cap/3 {
		hi = prev * 3
	}
	if hi < s.base {
		hi = s.base
	}
	d := s.base + scale(hi-s.base, u)
	return min(d, s.cap)
}
