package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/event"
)

// Defaults used for zero HintsConfig fields. A pause longer than 30 s is
// one no caller under a typical deadline waits out (it matches
// guardrail.DefaultMaxRetryAfter); 64 queued hints are far more than a
// fleet publishes in the time a bus takes to answer, since a process
// publishes a pause once, not once per call; a second is the longest a
// publish may hold the queue behind it.
const (
	DefaultMaxPause       = 30 * time.Second
	DefaultMaxQueued      = 64
	DefaultPublishTimeout = time.Second
)

// HintKind says what a Hint reports. It is a plain value, safe for
// concurrent use.
type HintKind uint8

// The kinds of hints.
const (
	// HintPause: the dependency asked to be left alone for a while (an
	// HTTP Retry-After, a gRPC pushback).
	HintPause HintKind = iota + 1
	// HintBreakerOpen: a process's breaker for the dependency opened, for
	// the breaker's open time.
	HintBreakerOpen
)

// String returns "pause", "breaker_open" or "unknown".
func (k HintKind) String() string {
	switch k {
	case HintPause:
		return "pause"
	case HintBreakerOpen:
		return "breaker_open"
	}
	return "unknown"
}

// Hint is what one process learnt about a dependency and tells the others:
// the dependency should not be called for a while. It is advisory: a
// process that never receives it only loses the head start it offers. A
// Hint is a plain value.
type Hint struct {
	// Dependency names the dependency, as the receivers know it (a
	// Policy's Name, a host).
	Dependency string
	// Kind says what was seen.
	Kind HintKind
	// At is when the publisher learnt it, by its own clock. A receiver
	// ends the pause at At+For or For after it received the hint,
	// whichever comes first, so a clock ahead of the receiver's cannot
	// lengthen a pause, and a hint that was delayed is shortened by the
	// delay. Zero means the pause runs from receipt.
	At time.Time
	// For is how long the dependency asked to be left alone, or the
	// breaker stays open. A receiver caps it at its MaxPause.
	For time.Duration
	// Origin identifies the Hints that published it, so that a process
	// ignores its own hints when the bus brings them back.
	Origin string
}

// Until returns At+For, when the publisher's pause ends, or the zero Time
// when At is zero.
func (h Hint) Until() time.Time {
	if h.At.IsZero() {
		return time.Time{}
	}
	return h.At.Add(h.For)
}

// Bus carries hints between the processes of a fleet: Redis pub/sub
// (package redisbus of the redisstore module), NATS, or anything that
// broadcasts a small message to every subscriber. Delivery is best effort:
// a hint may be lost, duplicated or delivered late, and Hints is built for
// all three.
//
// Implementations must be safe for concurrent use.
type Bus interface {
	// Publish sends h to every subscriber, this process's own included,
	// or returns an error. It must return when ctx ends.
	Publish(ctx context.Context, h Hint) error
	// Subscribe starts delivering every hint published on the bus to
	// deliver, one at a time, on a goroutine of the bus's own, and
	// returns once the bus has confirmed the subscription, or an error
	// when it could not (ctx bounds the wait). The bus reconnects and
	// resubscribes on its own after that. stop ends the subscription and
	// returns once deliver is no longer running and will not be called
	// again.
	Subscribe(ctx context.Context, deliver func(Hint)) (stop func(), err error)
}

// HintsConfig configures Hints: a plain value that NewHints copies. The
// zero value is valid and does nothing: it accepts no dependency and has
// no bus.
type HintsConfig struct {
	// Bus carries the hints to and from the other processes. Nil keeps
	// them in this process: a pause one call was asked for still holds
	// back this process's other calls to the dependency.
	Bus Bus

	// Dependencies are the names this process accepts hints about, from
	// its own calls and from the bus: a small fixed set, the names its
	// policies give their dependencies. A hint about any other name is
	// dropped, so a peer cannot make this process hold state for names it
	// never calls. Empty accepts none.
	Dependencies []string

	// MaxPause caps the pause a hint imposes, whatever it asks: a hint can
	// hold a dependency back for at most this long from the moment it is
	// received or published. Zero means DefaultMaxPause (30 s); a negative
	// value is invalid (an advisory pause always has a bound).
	MaxPause time.Duration

	// MaxQueued bounds the hints waiting to be published. A hint published
	// while that many wait is dropped and counted (ReasonHintQueueFull): a
	// slow or lost bus never holds a call back. Zero means
	// DefaultMaxQueued (64); a negative value is invalid.
	MaxQueued int

	// PublishTimeout bounds each Publish on the bus. Zero means
	// DefaultPublishTimeout (1 s); a negative value is invalid.
	PublishTimeout time.Duration

	// Observer receives an event.FleetHint event for each hint published,
	// applied or dropped. Nil costs nothing.
	Observer event.Observer
}

// HintStats counts what Hints did since it was built, for metrics and
// tests. It is a plain value.
type HintStats struct {
	// Published counts the hints handed to the bus without an error.
	Published uint64
	// Suppressed counts the hints not published because the pause they
	// asked for was already known here, from an earlier hint of this
	// process or a peer's.
	Suppressed uint64
	// Dropped counts the hints not published: the queue was full, the bus
	// returned an error, or Hints was closed first.
	Dropped uint64
	// Applied counts the peers' hints that paused a dependency here.
	Applied uint64
	// Rejected counts the received hints that were ignored: an unknown
	// dependency or kind, no duration, or already expired.
	Rejected uint64
}

// Hints shares the pauses a fleet's dependencies ask for: a process that
// was answered "Retry-After: 10" by a dependency, or whose breaker for it
// opened, publishes it, and every process accepting hints about that
// dependency holds its calls back until the pause ends (see Paused).
//
// It never blocks a call: Paused reads an atomic value, and publishing
// queues the hint for a goroutine of its own, dropping it when the queue
// is full. A lost bus therefore costs the head start hints give and
// nothing else: no call waits on it and no pause outlives its hint, which
// expires by itself, at most MaxPause after it was received.
//
// Hints is safe for concurrent use. It starts two goroutines when it has a
// Bus: one that publishes and one that subscribes (it ends once
// subscribed); Close stops them.
type Hints struct {
	bus      Bus
	obs      event.Observer
	maxPause time.Duration
	timeout  time.Duration
	origin   string
	deps     map[string]*depHints // read only after NewHints

	queue      chan Hint
	done       chan struct{}
	subscribed chan struct{}
	wg         sync.WaitGroup
	ctx        context.Context // ends at Close: bounds the bus's calls
	cancel     context.CancelFunc
	closeOnce  sync.Once
	mu         sync.Mutex
	stop       func() // the bus subscription's, once subscribed
	closed     bool   // under mu

	published, suppressed, dropped, applied, rejected atomic.Uint64
}

// depHints is what is known about one dependency, as unix nanoseconds of
// the ends of the pauses; zero is none.
type depHints struct {
	name  string
	pause atomic.Int64 // a Retry-After, this process's or a peer's
	open  atomic.Int64 // a peer's breaker
	sent  [HintBreakerOpen + 1]atomic.Int64
}

// NewHints returns Hints configured by cfg, or an error that Is
// ErrInvalidConfig and names every invalid field. With a Bus, it starts
// subscribing in the background and returns without waiting for the bus:
// Subscribed reports when hints from the bus arrive.
func NewHints(cfg HintsConfig) (*Hints, error) {
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, invalidHints(field, v, want))
	}
	h := &Hints{
		bus:        cfg.Bus,
		obs:        cfg.Observer,
		maxPause:   cfg.MaxPause,
		timeout:    cfg.PublishTimeout,
		deps:       make(map[string]*depHints, len(cfg.Dependencies)),
		done:       make(chan struct{}),
		subscribed: make(chan struct{}),
	}
	switch {
	case h.maxPause == 0:
		h.maxPause = DefaultMaxPause
	case h.maxPause < 0:
		bad("MaxPause", cfg.MaxPause, "a positive duration, or zero for the default")
	}
	switch {
	case h.timeout == 0:
		h.timeout = DefaultPublishTimeout
	case h.timeout < 0:
		bad("PublishTimeout", cfg.PublishTimeout, "a positive duration, or zero for the default")
	}
	queue := cfg.MaxQueued
	switch {
	case queue == 0:
		queue = DefaultMaxQueued
	case queue < 0:
		bad("MaxQueued", cfg.MaxQueued, "a positive size, or zero for the default")
	}
	for _, d := range cfg.Dependencies {
		if d == "" {
			bad("Dependencies", `""`, "names that are not empty")
			break
		}
		h.deps[d] = &depHints{name: d}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var id [8]byte
	rand.Read(id[:]) // never fails (crypto/rand)
	h.origin = hex.EncodeToString(id[:])
	h.ctx, h.cancel = context.WithCancel(context.Background())
	if h.bus == nil {
		close(h.subscribed)
		return h, nil
	}
	h.queue = make(chan Hint, queue)
	h.wg.Add(2)
	go h.publishLoop()
	go h.subscribeLoop()
	return h, nil
}

// Origin returns the identifier Hints puts in the hints it publishes.
func (h *Hints) Origin() string { return h.origin }

// Subscribed returns a channel closed once hints from the bus are being
// received (at once without a Bus), or when Hints is closed first.
func (h *Hints) Subscribed() <-chan struct{} { return h.subscribed }

// Paused reports whether a hint pauses calls to dependency at now, and
// until when. It never blocks and allocates nothing: a dependency this
// Hints does not accept is never paused, and an expired pause is as
// good as forgotten.
func (h *Hints) Paused(dependency string, now time.Time) (until time.Time, ok bool) {
	d := h.deps[dependency]
	if d == nil {
		return time.Time{}, false
	}
	u := max(d.pause.Load(), d.open.Load())
	if u == 0 || u <= now.UnixNano() {
		return time.Time{}, false
	}
	return time.Unix(0, u), true
}

// RetryAfter reports that dependency asked, at now, to be left alone for
// d: this process's other calls hold back at once, and the hint is
// published for the others, unless a pause already known here covers it
// (within a tenth of d). d is capped at MaxPause.
func (h *Hints) RetryAfter(dependency string, d time.Duration, now time.Time) {
	h.publish(dependency, HintPause, d, now)
}

// BreakerOpened reports that this process's breaker for dependency
// opened at now for d, and publishes it for the others. It does not
// pause this process's calls: its own breaker already refuses them, and
// would stop when it is reset or forced closed.
func (h *Hints) BreakerOpened(dependency string, d time.Duration, now time.Time) {
	h.publish(dependency, HintBreakerOpen, d, now)
}

// Observe lets Hints watch a breaker: give it as (or join it into) a
// breaker.Config's Observer, and every transition to open that was not
// forced is published with BreakerOpened for the breaker's open time,
// under the breaker's Name (a Group's key). Other events are ignored. It
// returns ctx.
func (h *Hints) Observe(ctx context.Context, e event.Event) context.Context {
	if e.Kind == event.BreakerTransition && e.To == "open" && e.Delay > 0 {
		h.BreakerOpened(e.Dependency, e.Delay, time.Now())
	}
	return ctx
}

// Stats returns what Hints counted so far.
func (h *Hints) Stats() HintStats {
	return HintStats{
		Published:  h.published.Load(),
		Suppressed: h.suppressed.Load(),
		Dropped:    h.dropped.Load(),
		Applied:    h.applied.Load(),
		Rejected:   h.rejected.Load(),
	}
}

// Close stops publishing and subscribing and returns once the goroutines
// Hints started have ended; hints still queued are dropped. Paused keeps
// answering from what was received. Close is idempotent and returns nil.
func (h *Hints) Close() error {
	h.closeOnce.Do(func() {
		h.mu.Lock()
		h.closed = true
		h.mu.Unlock()
		close(h.done)
		h.cancel()
		h.wg.Wait()
		if h.stop != nil {
			h.stop()
		}
		for range len(h.queue) {
			<-h.queue
			h.dropped.Add(1)
		}
	})
	return nil
}

// publish applies a pause of this process's locally and queues it for the
// bus.
func (h *Hints) publish(dependency string, kind HintKind, d time.Duration, now time.Time) {
	dh := h.deps[dependency]
	if dh == nil || d <= 0 {
		return
	}
	d = min(d, h.maxPause)
	until := now.Add(d).UnixNano()
	slack := int64(d / 10)
	known := max(dh.sent[kind].Load(), dh.pause.Load())
	if kind == HintBreakerOpen {
		known = max(dh.sent[kind].Load(), dh.open.Load())
	}
	if kind == HintPause {
		raise(&dh.pause, until)
	}
	if known >= until-slack {
		h.suppressed.Add(1)
		return
	}
	raise(&dh.sent[kind], until)
	if h.bus == nil {
		return
	}
	hint := Hint{Dependency: dependency, Kind: kind, At: now, For: d, Origin: h.origin}
	select {
	case <-h.done:
		h.dropped.Add(1)
	case h.queue <- hint:
	default:
		h.dropped.Add(1)
		h.observe(hint, event.ReasonHintQueueFull, nil)
	}
}

// raise sets v to n if n is later.
func raise(v *atomic.Int64, n int64) {
	for {
		cur := v.Load()
		if cur >= n || v.CompareAndSwap(cur, n) {
			return
		}
	}
}

// publishLoop hands queued hints to the bus, one at a time.
func (h *Hints) publishLoop() {
	defer h.wg.Done()
	for {
		select {
		case <-h.done:
			return
		case hint := <-h.queue:
			ctx, cancel := context.WithTimeout(h.ctx, h.timeout)
			err := h.bus.Publish(ctx, hint)
			cancel()
			if err != nil {
				h.dropped.Add(1)
				h.observe(hint, event.ReasonHintPublishFailed, err)
				continue
			}
			h.published.Add(1)
			h.observe(hint, event.ReasonHintPublished, nil)
		}
	}
}

// subscribeLoop subscribes to the bus, trying again with a growing delay
// (100 ms doubling up to 5 s) until the bus confirms or Hints is closed.
func (h *Hints) subscribeLoop() {
	defer h.wg.Done()
	defer func() {
		select {
		case <-h.subscribed:
		default:
			close(h.subscribed)
		}
	}()
	delay := 100 * time.Millisecond
	var timer *time.Timer
	for {
		ctx, cancel := context.WithTimeout(h.ctx, max(h.timeout, time.Second))
		stop, err := h.bus.Subscribe(ctx, h.receive)
		cancel()
		if err == nil {
			h.mu.Lock()
			closed := h.closed
			if !closed {
				h.stop = stop
			}
			h.mu.Unlock()
			if closed {
				stop()
			}
			return
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-h.done:
			return
		case <-timer.C:
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// receive applies a hint that came from the bus.
func (h *Hints) receive(hint Hint) {
	if hint.Origin == h.origin {
		return // this process's own, applied when it was published
	}
	dh := h.deps[hint.Dependency]
	now := time.Now()
	var v *atomic.Int64
	if dh != nil {
		switch hint.Kind {
		case HintPause:
			v = &dh.pause
		case HintBreakerOpen:
			v = &dh.open
		}
	}
	if v == nil || hint.For <= 0 {
		h.reject(hint)
		return
	}
	until := now.Add(min(hint.For, h.maxPause))
	if u := hint.Until(); !u.IsZero() && u.Before(until) {
		until = u
	}
	if !until.After(now) {
		h.reject(hint)
		return
	}
	raise(v, until.UnixNano())
	h.applied.Add(1)
	if h.obs != nil {
		hint.For = until.Sub(now)
		h.observe(hint, event.ReasonHintApplied, nil)
	}
}

func (h *Hints) reject(hint Hint) {
	h.rejected.Add(1)
	if h.obs != nil {
		if h.deps[hint.Dependency] == nil {
			// Not a label: a peer may send any name.
			hint.Dependency = ""
		}
		h.observe(hint, event.ReasonHintRejected, nil)
	}
}

// observe reports a FleetHint event.
func (h *Hints) observe(hint Hint, reason string, err error) {
	if h.obs == nil {
		return
	}
	h.obs.Observe(context.Background(), event.Event{
		Kind:       event.FleetHint,
		Dependency: hint.Dependency,
		Reason:     reason,
		Detail:     hint.Kind.String(),
		Delay:      hint.For,
		Err:        err,
		Remaining:  -1,
	})
}

// invalidHints reports field of a HintsConfig holding got, and what is
// allowed.
func invalidHints(field string, got any, want string) error {
	return &configError{fmt.Sprintf("fleet: HintsConfig.%s is %v; want %s", field, got, want)}
}
