// Package metastable tells when a system stays down after what brought it
// down is gone, and, when asked, acts until it comes back.
//
// A dependency fails over for a few seconds; its callers time out and
// retry; when it is back, the retries, the queued requests whose callers
// already left and the work done for them keep it at full load with
// almost nothing useful coming out. The trigger is over, the system is
// not: it is metastable, and it stays so until the load drops. A Detector
// watches one dependency's guarded calls and reports, once a window, one
// of three states:
//
//	normal      goodput (the share of calls that succeed) at or above
//	            Config.Recovered, or too few calls to judge
//	degraded    goodput below Config.Goodput while the dependency is down,
//	            or without the symptoms below
//	metastable  the dependency answers again (Config.Healthy), goodput
//	            stays below Config.Goodput, and retries per call, the
//	            shedders' queueing or the work abandoned by callers that left
//	            stay above their thresholds, for Config.Hold windows in a
//	            row
//
// Each change is an event.Metastable event (and the
// guardrail_metastable_state gauge of the metrics adapters). With
// Relief.Act set, the Detector also acts while the state is metastable:
// it empties the retry budgets it was given, cuts its shedders' limits
// (again at every window goodput is not back), drops what they queue and
// makes their Retry-After longer. Once goodput has been back at
// Config.Recovered for Config.Hold windows it gives the limits back in
// steps, one a window while goodput holds (a window that falls back cuts
// again), and the state is normal when they are whole. It removes no load a caller offers: it only stops this process
// from multiplying it, and refuses early what it could not serve in time.
//
// A Detector is an event.Observer: join it to the Observer of the Policy
// (or the guardhttp/guardgrpc client) whose calls it watches, and run its
// windows with Run:
//
//	d, err := metastable.New(metastable.Config{Name: "db", Relief: metastable.Relief{
//		Act: true, Budgets: []*budget.Budget{b}, Shedders: []*shed.Shedder{s}}})
//	pol := &guardrail.Policy{Name: "db", Retry: guardrail.Retry{Budget: b}, Observer: event.Join(prom, d)}
//	go d.Run(ctx)
package metastable

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/shed"
)

// ErrInvalidConfig is wrapped by the error New returns for a Config it
// cannot run with.
var ErrInvalidConfig = errors.New("metastable: invalid config")

// The defaults of Config's zero fields.
const (
	DefaultWindow     = time.Second
	DefaultHold       = 3
	DefaultMinCalls   = 20
	DefaultGoodput    = 0.5
	DefaultRecovered  = 0.9
	DefaultRetryRatio = 0.2
	DefaultQueueWait  = 100 * time.Millisecond
	DefaultWasted     = 0.25
	DefaultCut        = 0.5
	DefaultRetryAfter = 10 * time.Second
)

// State is what a Detector sees; a plain value.
type State uint8

// The states.
const (
	Normal State = iota
	Degraded
	Metastable
)

var stateNames = [...]string{Normal: "normal", Degraded: "degraded", Metastable: "metastable"}

// String returns the state's name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// Config configures a Detector. The zero value of each field but Name
// means the default it names. It is a plain value that New reads once;
// Healthy is called from the goroutine of Run (or of Evaluate) only.
type Config struct {
	// Name is the dependency watched: the Dependency of the events
	// counted (a Policy's Name, a guardhttp or guardgrpc Config.Name).
	// Required.
	Name string
	// Window is how often the Detector judges, over the calls that ended
	// since it last did. Default DefaultWindow, 1 s.
	Window time.Duration
	// Hold is how many windows in a row the symptoms must last before the
	// state is metastable, and goodput must be back before it is normal
	// again. Default DefaultHold, 3.
	Hold int
	// MinCalls is the fewest calls a window needs to be judged; a window
	// with fewer changes nothing. Default DefaultMinCalls, 20.
	MinCalls int
	// Goodput is the share of calls that succeed below which goodput is
	// low, in (0, 1]. Default DefaultGoodput, 0.5.
	Goodput float64
	// Recovered is the share at or above which goodput is back, in
	// [Goodput, 1]. Default DefaultRecovered, 0.9.
	Recovered float64
	// RetryRatio is the retries per call above which retries are high.
	// Default DefaultRetryRatio, 0.2 (the default retry budget allows 0.1).
	RetryRatio float64
	// QueueWait is the mean time the requests admitted by Relief.Shedders
	// waited in their queues above which queueing is high. Default
	// DefaultQueueWait, 100 ms.
	QueueWait time.Duration
	// Wasted is the share of attempts whose work nobody used (an attempt
	// that timed out, a call whose caller left or whose deadline passed
	// while it ran: work the dependency did, or queued, for a caller that
	// had gone) above which wasted work is high, in (0, 1]. Default
	// DefaultWasted, 0.25.
	Wasted float64
	// Healthy reports whether the trigger is over: the dependency itself
	// is up (a health check that does not queue behind the load: a ping
	// on a connection of its own, the failover's status). It is called
	// once a window, with a context that ends with the window. Nil means
	// the dependency is up when at least one call to it succeeded in the
	// window: it answers, if slowly.
	Healthy func(ctx context.Context) error
	// Relief is what the Detector does while the state is metastable.
	// The zero value does nothing: the Detector only reports.
	Relief Relief
	// Observer receives the event.Metastable events; nil reports nowhere.
	Observer event.Observer
}

// Relief is the Detector's actuator: a plain value, part of Config. The
// budgets and shedders it holds are safe for concurrent use, so the
// Detector acts on them while they serve.
type Relief struct {
	// Act turns the actuator on. Without it the Detector only reports,
	// and Shedders only feed its queueing signal.
	Act bool
	// Budgets are emptied when the state becomes metastable and at every
	// window while it stays so: the process sends almost no retries.
	// Deposits refill them as usual once the state is normal.
	Budgets []*budget.Budget
	// Shedders are relieved (shed.Shedder.Relieve) while the state is
	// metastable: their limits cut to Cut of what they were, and cut again
	// at every window that did not bring goodput back, their queues
	// dropped and their Retry-After set to RetryAfter. Goodput back, their
	// limits grow by 1/Cut a window until they are whole. Their queueing is also a symptom the
	// Detector watches, whether Act is set or not.
	Shedders []*shed.Shedder
	// Cut is the share of a shedder's limit it keeps while relieved, in
	// (0, 1). Default DefaultCut, 0.5.
	Cut float64
	// RetryAfter is the Retry-After the relieved shedders answer. Default
	// DefaultRetryAfter, 10 s.
	RetryAfter time.Duration
	// OnChange, if set, is called with true when the actuator starts and
	// false when it stops, for anything else the process can shed (a
	// consumer to pause, a cache to serve stale from). It runs on the
	// goroutine of Run and must not block.
	OnChange func(acting bool)
}

// Window is what a Detector measured over one window: the basis of its
// last judgment, for tests and status pages. A plain value.
type Window struct {
	End         time.Time     // when the window ended: the now of EvaluateAt
	Calls, OK   int64         // calls that ended, and those that succeeded
	Attempts    int64         // attempts started
	Retries     int64         // retries scheduled
	Timeouts    int64         // attempts that ended on a timeout
	Abandoned   int64         // calls that ended because their caller left or their deadline passed
	QueueWait   time.Duration // mean queue wait of the admitted requests of Relief.Shedders
	Healthy     bool          // the trigger is over
	Judged      bool          // the window had at least MinCalls calls
	State       State         // the state after it
	Acting      bool          // the actuator is on after it
	Symptomatic bool          // retries, queueing or wasted work were high
}

// Goodput returns OK / Calls, or 1 without calls.
func (w Window) Goodput() float64 {
	if w.Calls == 0 {
		return 1
	}
	return float64(w.OK) / float64(w.Calls)
}

// RetryRatio returns Retries / Calls, or 0 without calls.
func (w Window) RetryRatio() float64 {
	if w.Calls == 0 {
		return 0
	}
	return float64(w.Retries) / float64(w.Calls)
}

// WastedShare returns the share of the attempts whose work nobody
// used: (Timeouts + Abandoned) / Attempts, at most 1, or 0 without
// attempts. An abandoned call had an attempt in flight when its caller
// left.
func (w Window) WastedShare() float64 {
	if w.Attempts == 0 {
		return 0
	}
	return min(1, float64(w.Timeouts+w.Abandoned)/float64(w.Attempts))
}

// Detector watches one dependency's calls; see the package doc. Observe
// is safe for concurrent use and takes no lock; Evaluate and Run are
// meant for one goroutine.
type Detector struct {
	cfg Config

	calls, ok, attempts, retries, timeouts, abandoned atomic.Int64

	mu     sync.Mutex // guards below: Evaluate against State and Last
	state  State
	acting bool
	easing bool // acting, and giving the shedders' limits back
	run    int  // windows in a row toward the next state
	last   Window
	queued []queueMark // per shedder: its counters at the last window
}

type queueMark struct {
	n uint64
	t time.Duration
}

// New returns a Detector for cfg, or an error wrapping ErrInvalidConfig
// that names every invalid field.
func New(cfg Config) (*Detector, error) {
	var errs []error
	bad := func(field string, got any, want string) {
		errs = append(errs, fmt.Errorf("%w: Config.%s is %v; want %s", ErrInvalidConfig, field, got, want))
	}
	if cfg.Name == "" {
		bad("Name", `""`, "the dependency's name")
	}
	unit := func(field string, v *float64, def float64, lo float64) {
		switch {
		case *v == 0:
			*v = def
		case !(*v > lo && *v <= 1): // also NaN
			bad(field, *v, fmt.Sprintf("a value in (%v, 1], or zero for %v", lo, def))
		}
	}
	positive := func(field string, v *time.Duration, def time.Duration) {
		switch {
		case *v == 0:
			*v = def
		case *v < 0:
			bad(field, *v, fmt.Sprintf("a positive duration, or zero for %v", def))
		}
	}
	count := func(field string, v *int, def int) {
		switch {
		case *v == 0:
			*v = def
		case *v < 0:
			bad(field, *v, fmt.Sprintf("1 or more, or zero for %d", def))
		}
	}
	positive("Window", &cfg.Window, DefaultWindow)
	positive("QueueWait", &cfg.QueueWait, DefaultQueueWait)
	positive("Relief.RetryAfter", &cfg.Relief.RetryAfter, DefaultRetryAfter)
	count("Hold", &cfg.Hold, DefaultHold)
	count("MinCalls", &cfg.MinCalls, DefaultMinCalls)
	unit("Goodput", &cfg.Goodput, DefaultGoodput, 0)
	unit("Recovered", &cfg.Recovered, DefaultRecovered, 0)
	unit("Wasted", &cfg.Wasted, DefaultWasted, 0)
	if cfg.Recovered < cfg.Goodput {
		bad("Recovered", cfg.Recovered, fmt.Sprintf("at least Goodput, %v", cfg.Goodput))
	}
	switch r := cfg.RetryRatio; {
	case r == 0:
		cfg.RetryRatio = DefaultRetryRatio
	case !(r > 0) || math.IsInf(r, 1):
		bad("RetryRatio", r, fmt.Sprintf("a positive finite value, or zero for %v", DefaultRetryRatio))
	}
	switch c := cfg.Relief.Cut; {
	case c == 0:
		cfg.Relief.Cut = DefaultCut
	case !(c > 0 && c < 1):
		bad("Relief.Cut", c, fmt.Sprintf("a value in (0, 1), or zero for %v", DefaultCut))
	}
	for i, b := range cfg.Relief.Budgets {
		if b == nil {
			bad(fmt.Sprintf("Relief.Budgets[%d]", i), "nil", "a budget")
		}
	}
	for i, s := range cfg.Relief.Shedders {
		if s == nil {
			bad(fmt.Sprintf("Relief.Shedders[%d]", i), "nil", "a shedder")
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	d := &Detector{cfg: cfg, queued: make([]queueMark, len(cfg.Relief.Shedders))}
	for i, s := range cfg.Relief.Shedders {
		st := s.Stats()
		d.queued[i] = queueMark{st.QueuedAdmitted, st.QueueTime}
	}
	return d, nil
}

// Observe counts the events of the dependency's calls: calls ended and
// their outcome, attempts, retries and timeouts. It never blocks and
// allocates nothing; it returns ctx.
func (d *Detector) Observe(ctx context.Context, e event.Event) context.Context {
	if e.Dependency != d.cfg.Name {
		return ctx
	}
	switch e.Kind {
	case event.CallEnd:
		d.calls.Add(1)
		switch e.Outcome {
		case event.OutcomeOK:
			d.ok.Add(1)
		case event.OutcomeCanceled, event.OutcomeDeadline:
			d.abandoned.Add(1)
		}
	case event.AttemptStart:
		d.attempts.Add(1)
	case event.Retry:
		d.retries.Add(1)
	case event.Timeout:
		d.timeouts.Add(1)
	}
	return ctx
}

// Run judges a window every Config.Window until ctx ends, then stops the
// actuator if it is on, and returns.
func (d *Detector) Run(ctx context.Context) {
	t := time.NewTicker(d.cfg.Window)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			d.mu.Lock()
			acting := d.acting
			if acting {
				d.actLocked(false)
			}
			d.mu.Unlock()
			if acting && d.cfg.Relief.OnChange != nil {
				d.cfg.Relief.OnChange(false)
			}
			return
		case now := <-t.C:
			d.EvaluateAt(ctx, now)
		}
	}
}

// State returns the state after the last window.
func (d *Detector) State() State {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state
}

// Last returns what the last window measured.
func (d *Detector) Last() Window {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// Evaluate is EvaluateAt at time.Now().
func (d *Detector) Evaluate(ctx context.Context) Window { return d.EvaluateAt(ctx, time.Now()) }

// EvaluateAt ends the window at now: it judges the calls counted since the
// last one, moves the state, starts or stops the actuator, and returns what
// it measured. Run calls it once a Window; a test may call it instead.
func (d *Detector) EvaluateAt(ctx context.Context, now time.Time) Window {
	w := Window{
		End:   now,
		Calls: d.calls.Swap(0), OK: d.ok.Swap(0), Attempts: d.attempts.Swap(0),
		Retries: d.retries.Swap(0), Timeouts: d.timeouts.Swap(0), Abandoned: d.abandoned.Swap(0),
	}
	w.QueueWait = d.queueWait()
	w.Judged = w.Calls >= int64(d.cfg.MinCalls)
	if w.Judged {
		w.Healthy = d.healthy(ctx, w)
	}
	w.Symptomatic = w.RetryRatio() > d.cfg.RetryRatio || w.QueueWait > d.cfg.QueueWait || w.WastedShare() > d.cfg.Wasted

	d.mu.Lock()
	from, wasActing := d.state, d.acting
	if w.Judged {
		d.judgeLocked(w)
	}
	if d.acting && !d.easing {
		for _, b := range d.cfg.Relief.Budgets {
			b.Drain()
		}
	}
	w.State, w.Acting = d.state, d.acting
	d.last = w
	d.mu.Unlock()

	// The callbacks run without the lock: they may ask for State or Last.
	if w.Acting != wasActing && d.cfg.Relief.OnChange != nil {
		d.cfg.Relief.OnChange(w.Acting)
	}
	if w.State != from {
		d.report(ctx, from, wasActing, w)
	}
	return w
}

// judgeLocked moves the state on a judged window. The caller holds d.mu.
func (d *Detector) judgeLocked(w Window) {
	low, back := w.Goodput() < d.cfg.Goodput, w.Goodput() >= d.cfg.Recovered
	switch d.state {
	case Normal, Degraded:
		switch {
		case low && w.Healthy && w.Symptomatic:
			d.run++
			d.state = Degraded
			if d.run >= d.cfg.Hold {
				d.state, d.run = Metastable, 0
				if d.cfg.Relief.Act {
					d.actLocked(true)
				}
			}
		case low:
			d.state, d.run = Degraded, 0
		case back:
			d.state, d.run = Normal, 0
		default:
			d.run = 0 // between the two thresholds: no change
		}
	case Metastable:
		if !back {
			d.run, d.easing = 0, false
			if d.acting {
				d.pressLocked()
			}
			return
		}
		d.run++
		if d.run < d.cfg.Hold {
			return
		}
		if d.acting {
			// Back for Hold windows: give the shedders' limits back in
			// steps, one a window while goodput holds.
			d.easing = true
			if d.easeLocked() {
				return
			}
		}
		d.state, d.run, d.easing = Normal, 0, false
		if d.acting {
			d.actLocked(false)
		}
	}
}

// actLocked starts or stops the actuator. The caller holds d.mu.
func (d *Detector) actLocked(on bool) {
	d.acting = on
	r := d.cfg.Relief
	for _, s := range r.Shedders {
		if on {
			s.Relieve(r.Cut, r.RetryAfter)
		} else {
			s.Relieve(0, 0)
		}
	}
	if on {
		for _, b := range r.Budgets {
			b.Drain()
		}
	}
}

// easeLocked grows the relieved shedders' cut limits by 1/Cut, and
// reports whether any of them is still relieved. The caller holds d.mu.
func (d *Detector) easeLocked() bool {
	r := d.cfg.Relief
	relieved := false
	for _, s := range r.Shedders {
		if s.Relieve(1/r.Cut, r.RetryAfter) {
			relieved = true
		}
	}
	return relieved
}

// pressLocked cuts the relieved shedders again: a window of the actuator
// that did not bring goodput back halves what they admit once more. The
// caller holds d.mu.
func (d *Detector) pressLocked() {
	r := d.cfg.Relief
	for _, s := range r.Shedders {
		s.Relieve(r.Cut, r.RetryAfter)
	}
}

// queueWait returns the mean queue wait of the requests the shedders
// admitted after queueing since the last window.
func (d *Detector) queueWait() time.Duration {
	var n uint64
	var t time.Duration
	for i, s := range d.cfg.Relief.Shedders {
		st := s.Stats()
		n += st.QueuedAdmitted - d.queued[i].n
		t += st.QueueTime - d.queued[i].t
		d.queued[i] = queueMark{st.QueuedAdmitted, st.QueueTime}
	}
	if n == 0 {
		return 0
	}
	return t / time.Duration(n)
}

func (d *Detector) healthy(ctx context.Context, w Window) bool {
	if d.cfg.Healthy == nil {
		return w.OK > 0
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Window)
	defer cancel()
	return d.cfg.Healthy(ctx) == nil
}

func (d *Detector) report(ctx context.Context, from State, wasActing bool, w Window) {
	if d.cfg.Observer == nil {
		return
	}
	detail := fmt.Sprintf("goodput %.2f of %d calls, %.2f retries per call, %.0f%% of attempts wasted, mean queue wait %v",
		w.Goodput(), w.Calls, w.RetryRatio(), 100*w.WastedShare(), w.QueueWait.Round(time.Millisecond))
	if w.Healthy {
		detail += "; the dependency is up"
	} else {
		detail += "; the dependency is down"
	}
	reason := ""
	switch {
	case w.Acting:
		detail += "; relief on"
		reason = event.ReasonRelief
	case wasActing:
		detail += "; relief off"
	}
	d.cfg.Observer.Observe(ctx, event.Event{
		Kind: event.Metastable, Dependency: d.cfg.Name,
		From: from.String(), To: w.State.String(), Reason: reason, Detail: detail,
	})
}
