package lab

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Bounds shared by the experiments' flags. Each is far above what a run on
// a laptop asks for; what they stop is a mistyped value that would exhaust
// memory (a slice per request or per bucket), overflow a product of a rate
// and a duration, or hold the terminal for hours.
const (
	// maxRun bounds a flag that is one run's length (a phase, an
	// observation, a warm-up) and the sum of those that make one run.
	maxRun = time.Hour
	// maxWait bounds a flag that is one request's time: a timeout, a
	// service time, a backoff.
	maxWait = 10 * time.Minute
	// maxRPS is the most requests per second one lab process sends: the
	// shedding rows already reach 6000 and the load generator is a
	// goroutine per request.
	maxRPS = 20000
	// maxRequests bounds the requests one row sends (and records, one
	// entry each, to compute its percentiles).
	maxRequests = 2_000_000
	// maxConcurrency bounds a flag that is a number of goroutines,
	// connections or slots held at once.
	maxConcurrency = 65535
	// maxAttemptsFlag bounds a flag that counts attempts per call.
	maxAttemptsFlag = 100
	// maxListEntries bounds a comma-separated flag, each of whose entries
	// is a row, a run or a phase of its own.
	maxListEntries = 32
)

// checkList returns a FlagError when the comma-separated value s of the
// flag --name has more than maxListEntries entries.
func checkList(name, s string) error {
	if n := strings.Count(s, ",") + 1; n > maxListEntries {
		return flagErrorf("--%s has %d entries; want at most %d", name, n, maxListEntries)
	}
	return nil
}

// flagCheck collects every invalid flag of an experiment, so that a run
// reports them all at once rather than one per try.
type flagCheck struct{ msgs []string }

// failf records one invalid flag, in the lab's style: "--flag is V; want ...".
func (c *flagCheck) failf(format string, args ...any) {
	c.msgs = append(c.msgs, fmt.Sprintf(format, args...))
}

// err returns a FlagError naming every invalid flag, or nil.
func (c *flagCheck) err() error {
	if len(c.msgs) == 0 {
		return nil
	}
	return &FlagError{Msg: strings.Join(c.msgs, "; ")}
}

// number is what a flag's value can be bounded as.
type number interface {
	~int | ~int64 | ~float64
}

// span is the allowed range of a flag's value; openLo and openHi leave
// out the bound itself. A NaN is in no span.
type span[T number] struct {
	lo, hi         T
	openLo, openHi bool
}

// closed is [lo, hi].
func closed[T number](lo, hi T) span[T] { return span[T]{lo: lo, hi: hi} }

// above is (lo, hi]: a positive duration is above(0, max).
func above[T number](lo, hi T) span[T] { return span[T]{lo: lo, hi: hi, openLo: true} }

func (s span[T]) has(v T) bool {
	loOK := v >= s.lo
	if s.openLo {
		loOK = v > s.lo
	}
	hiOK := v <= s.hi
	if s.openHi {
		hiOK = v < s.hi
	}
	return loOK && hiOK // false for NaN, whose comparisons all are
}

// tooHigh reports whether v is out of s on the upper side, or NaN: the
// half of has that a flag whose lower bound has its own message needs.
func (s span[T]) tooHigh(v T) bool {
	if v != v { // NaN
		return true
	}
	if s.openHi {
		return v >= s.hi
	}
	return v > s.hi
}

func (s span[T]) String() string {
	l, r := "[", "]"
	if s.openLo {
		l = "("
	}
	if s.openHi {
		r = ")"
	}
	return fmt.Sprintf("%s%v, %v%s", l, s.lo, s.hi, r)
}

// within records the flag --name as invalid unless v is in s.
func within[T number](c *flagCheck, name string, v T, s span[T]) {
	if !s.has(v) {
		c.failf("--%s is %v; want a value in %v", name, v, s)
	}
}

// notAbove records the flag --name as invalid when v is above s (or NaN),
// for a flag whose lower bound is checked with a message of its own.
func notAbove[T number](c *flagCheck, name string, v T, s span[T]) {
	if s.tooHigh(v) {
		c.failf("--%s is %v; want a value in %v", name, v, s)
	}
}

// shiftSat returns d doubled k times (d << k), or math.MaxInt64 when that
// overflows: an exponential backoff's delay, which must never wrap to a
// negative (no wait at all) or to zero. A negative d or k counts as zero.
func shiftSat(d time.Duration, k int) time.Duration {
	if d <= 0 {
		return 0
	}
	if k <= 0 {
		return d
	}
	if k >= 63 || d > math.MaxInt64>>k {
		return math.MaxInt64
	}
	return d << k
}

// addSat returns a+b for non-negative durations, or math.MaxInt64 when that
// overflows.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
