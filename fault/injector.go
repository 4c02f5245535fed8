package fault

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// defaultHeader is the request header that asks for a fault when
// Config.HeaderFaults is set and Config.Header is empty.
const defaultHeader = "X-Fault"

// headerRule is the name under which Counters reports faults asked for by
// the X-Fault header. Rule names cannot contain parentheses, so it never
// collides with a rule.
const headerRule = "(header)"

// ErrClosed is returned for a request whose fault was cut short because the
// Injector was closed.
var ErrClosed = errors.New("fault: injector closed")

// Config configures an Injector. The zero Config injects nothing, and a
// zero field of a Rule or a Fault means the default its comment gives. New
// and Reconfigure refuse anything else that means nothing (a negative
// duration or size, a probability outside [0, 1], a status outside 400-599,
// a bad header name) with an error that names the field: a *RuleError for a
// rule's field, an error that Is ErrInvalidConfig for the Config's own. A Config
// is a plain value: New and Reconfigure copy it, so it may be reused.
type Config struct {
	// Rules are evaluated in order for every request; see Injector.
	Rules []Rule
	// HeaderFaults lets a request ask for its own fault with the Header
	// header (see ParseRule for its syntax). Zero (false) ignores the header:
	// left on, any caller could break the server.
	HeaderFaults bool
	// Header names the header read when HeaderFaults is set. Empty means
	// X-Fault. A gRPC call's metadata key is its lower case, x-fault.
	Header string
	// Rand returns uniform draws in [0, 1) for every random choice
	// (probabilities, latency draws). It is called from the goroutines of
	// the requests, so it must be safe for concurrent use. Nil means
	// math/rand/v2's Float64. NewRand(seed) returns one that replays the same
	// faults for the same sequence of requests.
	Rand func() float64
}

// Injector decides which faults each request gets and applies them, as a
// server middleware (Middleware) or a client transport (Transport), and to
// calls that are not HTTP through Apply (Wrap, package grpcfault). It is
// safe for concurrent use; its rules can be replaced while it serves.
//
// For each request the header fault (when enabled) comes first, then the
// rules in order. Each enabled rule that matches counts as matched, then
// fires with its probability. A Latency that fires adds its delay and the
// evaluation goes on; any other fault that fires ends it. The summed delay is
// waited first, then the other fault, if any, is applied.
type Injector struct {
	// state is the current configuration, replaced whole by Reconfigure.
	state atomic.Pointer[state]

	header [len(kinds)]counter // faults asked for by the header, by kind index

	done      chan struct{} // closed by Close
	closeOnce sync.Once
}

// state is one immutable configuration.
type state struct {
	rules        []*ruleState
	headerFaults bool
	header       string
	mdHeader     string         // header in lower case, the metadata key of gRPC
	rand         func() float64 // never nil
}

// ruleState is a rule with its counters, which live as long as the rule's
// name stays in the configuration.
type ruleState struct {
	rule      Rule
	mdHeaders map[string]string // rule.Match.Headers with lower-case keys
	counter   *counter
}

type counter struct {
	matched, fired atomic.Uint64
}

// Counter reports how often one rule matched a request and how often it
// fired (injected its fault). It is a snapshot, a plain value.
type Counter struct {
	Rule    string `json:"rule"`    // the rule's name, or "(header)"
	Kind    string `json:"kind"`    // the rule's fault: "latency", "error"... as in a config file
	Matched uint64 `json:"matched"` // requests the rule matched
	Fired   uint64 `json:"fired"`   // requests it injected its fault into
}

// New returns an Injector configured by cfg, or an error that Is
// ErrInvalidConfig and names every invalid field: a *RuleError (errors.As)
// per invalid field of a rule, and one for Config.Header.
func New(cfg Config) (*Injector, error) {
	in := &Injector{done: make(chan struct{})}
	if err := in.Reconfigure(cfg); err != nil {
		return nil, err
	}
	return in, nil
}

// Reconfigure replaces the rules and the header settings with cfg's, and the
// random source when cfg.Rand is not nil. A rule keeps its counters when a
// rule of the same name was configured before. On error nothing changes.
// Requests already being served finish under the old rules.
func (in *Injector) Reconfigure(cfg Config) error {
	rules, err := normalizeRules(cfg.Rules)
	if cfg.Header == "" {
		cfg.Header = defaultHeader
	} else if !validToken(cfg.Header) {
		err = errors.Join(err, fmt.Errorf("%w: Config.Header is %q; want a header name", ErrInvalidConfig, cfg.Header))
	}
	if err != nil {
		return err
	}
	rnd := cfg.Rand
	old := map[string]*counter{}
	if s := in.state.Load(); s != nil {
		for _, rs := range s.rules {
			old[rs.rule.Name] = rs.counter
		}
		if rnd == nil {
			rnd = s.rand
		}
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	s := &state{headerFaults: cfg.HeaderFaults, header: http.CanonicalHeaderKey(cfg.Header),
		mdHeader: strings.ToLower(cfg.Header), rand: rnd}
	s.rules = make([]*ruleState, len(rules))
	for i, r := range rules {
		c := old[r.Name]
		if c == nil {
			c = new(counter)
		}
		rs := &ruleState{rule: r, counter: c}
		if len(r.Match.Headers) > 0 {
			rs.mdHeaders = make(map[string]string, len(r.Match.Headers))
			for name, v := range r.Match.Headers {
				rs.mdHeaders[strings.ToLower(name)] = v
			}
		}
		s.rules[i] = rs
	}
	in.state.Store(s)
	return nil
}

// Config returns the current configuration, rules normalized (names filled
// in, methods upper case). Its Rand is nil.
func (in *Injector) Config() Config {
	s := in.state.Load()
	cfg := Config{HeaderFaults: s.headerFaults, Header: s.header}
	cfg.Rules = make([]Rule, len(s.rules))
	for i, rs := range s.rules {
		cfg.Rules[i] = rs.rule
	}
	return cfg
}

// Counters returns one Counter per rule, in rule order, followed by one per
// kind of fault asked for by the X-Fault header (Rule "(header)"), if any.
func (in *Injector) Counters() []Counter {
	s := in.state.Load()
	out := make([]Counter, 0, len(s.rules))
	for _, rs := range s.rules {
		out = append(out, Counter{Rule: rs.rule.Name, Kind: string(rs.rule.Fault.kind()),
			Matched: rs.counter.matched.Load(), Fired: rs.counter.fired.Load()})
	}
	for i := range in.header {
		if n := in.header[i].matched.Load(); n > 0 {
			out = append(out, Counter{Rule: headerRule, Kind: string(kinds[i]), Matched: n,
				Fired: in.header[i].fired.Load()})
		}
	}
	return out
}

// resetCounters sets every counter to zero, for the admin endpoint.
func (in *Injector) resetCounters() {
	for _, rs := range in.state.Load().rules {
		rs.counter.matched.Store(0)
		rs.counter.fired.Store(0)
	}
	for i := range in.header {
		in.header[i].matched.Store(0)
		in.header[i].fired.Store(0)
	}
}

// Close releases every request held by a delay, a hang or a stall (their
// connections are aborted, client-side calls return ErrClosed) and makes the
// Injector inject nothing from then on. Call it before shutting a server
// down, or the shutdown waits for the hanging requests' clients. Close is
// idempotent.
func (in *Injector) Close() {
	in.closeOnce.Do(func() { close(in.done) })
}

func (in *Injector) closed() bool {
	select {
	case <-in.done:
		return true
	default:
		return false
	}
}

// plan is what happens to one request.
type plan struct {
	delay time.Duration
	fault Fault // nil: pass the request through
}

// decide evaluates the header fault and the rules for r. When the header was
// read it returns a copy of r without it, so it is never forwarded.
func (in *Injector) decide(r *http.Request) (plan, *http.Request, error) {
	if in.closed() {
		return plan{}, r, nil
	}
	s := in.state.Load()
	if !s.headerFaults && len(s.rules) == 0 {
		return plan{}, r, nil
	}
	var values []string
	if s.headerFaults {
		if values = r.Header.Values(s.header); len(values) > 0 {
			r2 := r.Clone(r.Context())
			r2.Header.Del(s.header)
			r = r2
		}
	}
	c := httpCall(r)
	p, err := in.decideCall(s, &c, values)
	return p, r, err
}

// decideCall evaluates the header faults asked for by values (read from
// the call by the caller when s.headerFaults is set) and s's rules for c.
func (in *Injector) decideCall(s *state, c *call, values []string) (plan, error) {
	var p plan
	for _, v := range values {
		rule, err := parseHeaderRule(v)
		if err != nil {
			return p, err
		}
		hc := &in.header[kindIndex(rule.Fault.kind())]
		hc.matched.Add(1)
		if !roll(s.rand, rule.Probability) {
			continue
		}
		hc.fired.Add(1)
		if apply(s.rand, &p, rule.Fault) {
			return p, nil
		}
	}
	for _, rs := range s.rules {
		if rs.rule.Disabled || !rs.rule.Match.matches(c, rs.mdHeaders) {
			continue
		}
		rs.counter.matched.Add(1)
		if !roll(s.rand, rs.rule.Probability) {
			continue
		}
		rs.counter.fired.Add(1)
		if apply(s.rand, &p, rs.rule.Fault) {
			break
		}
	}
	return p, nil
}

// apply adds f to p, drawing from rnd, and reports whether the evaluation
// ends.
func apply(rnd func() float64, p *plan, f Fault) bool {
	if l, ok := f.(Latency); ok {
		d := l.sample(rnd)
		if d > math.MaxInt64-p.delay { // saturate rather than wrap
			p.delay = math.MaxInt64
		} else {
			p.delay += d
		}
		return false
	}
	p.fault = f
	return true
}

// roll reports whether a rule with probability prob fires. prob 0 and 1
// both mean always and draw nothing, so always-rules do not shift the
// sequence of the others.
func roll(rnd func() float64, prob float64) bool {
	if prob == 0 || prob >= 1 {
		return true
	}
	return rnd() < prob
}

// wait blocks for d (forever when d < 0) and returns nil, or returns early
// with ctx's error, ErrClosed, or errBodyClosed when stop is closed.
func (in *Injector) wait(ctx context.Context, d time.Duration, stop <-chan struct{}) error {
	var tc <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-tc:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-in.done:
		return ErrClosed
	case <-stop:
		return errBodyClosed
	}
}

var errBodyClosed = errors.New("fault: read on closed response body")
