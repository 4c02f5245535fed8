package lab

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/guardhttp"
)

type retryAfterParams struct {
	asked      time.Duration
	deadline   time.Duration
	tooLong    time.Duration
	short      time.Duration
	clients    int
	status     int
	maxAttempt int
}

func retryAfter() Experiment {
	return bound(Experiment{
		Name:    "retry-after",
		Light:   true,
		Summary: "a server answering 429/503 with Retry-After: retries land no earlier than asked, never past the deadline",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := retryAfterParams{asked: time.Second, deadline: 3 * time.Second, tooLong: 5 * time.Second, short: 2 * time.Second, clients: 20, status: 429, maxAttempt: 3}
			if quick {
				p.clients = 5
			}
			fs.DurationVar(&p.asked, "retry-after", p.asked, "what the server asks (whole seconds: the header has no finer unit)")
			fs.DurationVar(&p.deadline, "deadline", p.deadline, "the client's deadline in the honoured rows")
			fs.DurationVar(&p.tooLong, "too-long", p.tooLong, "Retry-After of the last row, longer than its deadline")
			fs.DurationVar(&p.short, "short-deadline", p.short, "the client's deadline in the last row")
			fs.IntVar(&p.clients, "clients", p.clients, "concurrent calls per row")
			fs.IntVar(&p.status, "status", p.status, "status the server refuses with (429 or 503)")
			fs.IntVar(&p.maxAttempt, "attempts", p.maxAttempt, "client attempts per call")
			return &p
		},
	})
}

// raServer refuses each call's first request with Retry-After and answers
// the next ones; it records when it refused and when retries arrived.
type raServer struct {
	mu      sync.Mutex
	status  int
	asked   time.Duration
	date    bool
	refused map[string]time.Time // call id -> time the refusal was written
	until   map[string]time.Time // call id -> earliest time the server allowed
	gaps    []time.Duration      // retry arrival - refusal
	early   int                  // retries that arrived before the server allowed
	late    int                  // attempts that arrived after the caller's deadline
	calls   int
}

func (s *raServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Call")
	dl, _ := strconv.ParseInt(r.Header.Get("X-Test-Deadline"), 10, 64)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if dl > 0 && now.UnixNano() > dl {
		s.late++
	}
	if t, ok := s.refused[id]; ok {
		s.gaps = append(s.gaps, now.Sub(t))
		if now.Before(s.until[id]) {
			s.early++
		}
		_, _ = w.Write([]byte("ok"))
		return
	}
	allowed := now.Add(s.asked)
	if s.date {
		// An HTTP-date has whole seconds: round up so the promise holds.
		allowed = allowed.Truncate(time.Second).Add(time.Second)
		w.Header().Set("Retry-After", allowed.UTC().Format(http.TimeFormat))
	} else {
		w.Header().Set("Retry-After", strconv.Itoa(int(s.asked/time.Second)))
	}
	s.refused[id] = time.Now()
	s.until[id] = allowed
	w.WriteHeader(s.status)
}

// raRow is what one row measured, for its checks.
type raRow struct {
	honour          bool          // the deadline leaves time to wait as asked
	asked, deadline time.Duration // what the server asked, the caller's deadline
	late            lateness      // the machine's scheduling lateness while the calls ran
	retries, early  int           // retries the server saw, and those before it allowed them
	afterDeadline   int           // attempts that reached the server after their caller's deadline
	ok              int           // calls answered 200
	refusedAtOnce   int           // calls handed the refusal without a retry
	earliest        time.Duration // the soonest retry after its refusal; -1 if none
	slowest         time.Duration // the slowest call
}

// checks judges a row. The counts of retries, and of those earlier than
// asked, hold however busy the machine (a late timer cannot make a retry
// early); what happens by a time (success before the deadline, the
// refusal handed back at once, nothing arriving after the deadline) needs
// a machine quiet enough to time.
func (p retryAfterParams) checks(r *Result, row raRow) {
	pre := (&timing{}).needQuiet("", row.late)
	if row.honour {
		r.check(row.retries == p.clients && row.early == 0, "retry no earlier than asked",
			"%d of %d calls retried, %d before the server allowed, earliest %s after the refusal (allowed after %s)", row.retries, p.clients, row.early, fmtDur(row.earliest), fmtDur(row.asked))
		r.timed(pre, row.ok == p.clients, "retry succeeds in time", "%d of %d calls succeeded", row.ok, p.clients)
	} else {
		name := "no retry past the deadline"
		detail := "%d retries, %d callers handed the %d at once, slowest call %s: asked %s with %s left"
		args := []any{row.retries, row.refusedAtOnce, p.status, fmtDur(row.slowest), fmtDur(row.asked), fmtDur(row.deadline)}
		if row.retries != 0 {
			r.check(false, name, detail, args...) // a count: judged whatever the machine did
		} else {
			r.timed(pre, row.refusedAtOnce == p.clients && row.slowest < 200*time.Millisecond, name, detail, args...)
		}
	}
	r.timed(pre, row.afterDeadline == 0, "nothing after the deadline", "%d attempts reached the server after their caller's deadline", row.afterDeadline)
}

// checkFlags reports every flag the experiment cannot run with.
func (p retryAfterParams) checkFlags() error {
	var c flagCheck
	if p.asked < time.Second || p.asked%time.Second != 0 {
		c.failf("--retry-after must be whole seconds, at least 1s")
	}
	notAbove(&c, "retry-after", p.asked, closed(time.Second, maxWait))
	within(&c, "deadline", p.deadline, above(0, maxWait))
	// The last row's Retry-After, the same header: whole seconds too.
	if p.tooLong < time.Second || p.tooLong%time.Second != 0 {
		c.failf("--too-long must be whole seconds, at least 1s")
	}
	notAbove(&c, "too-long", p.tooLong, closed(time.Second, maxWait))
	within(&c, "short-deadline", p.short, above(0, maxWait))
	within(&c, "clients", p.clients, closed(1, 10_000)) // concurrent, a goroutine and a connection each
	if p.status != 429 && p.status != 503 {
		c.failf("--status must be 429 or 503")
	}
	within(&c, "attempts", p.maxAttempt, closed(1, maxAttemptsFlag))
	return c.err()
}

func (p retryAfterParams) run(ctx context.Context, env *Env) (*Result, error) {
	r := &Result{Experiment: "retry-after", Title: fmt.Sprintf("a server answering %d with Retry-After: retries wait as long as asked, and none outlives its caller's deadline", p.status)}
	rows := []struct {
		label    string
		date     bool
		asked    time.Duration
		deadline time.Duration
		honour   bool
	}{
		{fmt.Sprintf("Retry-After: %d (seconds), deadline %v", int(p.asked/time.Second), p.deadline), false, p.asked, p.deadline, true},
		{fmt.Sprintf("Retry-After: HTTP-date, deadline %v", p.deadline), true, p.asked, p.deadline, true},
		{fmt.Sprintf("Retry-After: %d, deadline %v", int(p.tooLong/time.Second), p.short), false, p.tooLong, p.short, false},
	}
	for i, row := range rows {
		env.Progress("retry-after: row %d/%d", i+1, len(rows))
		srv := &raServer{status: p.status, asked: row.asked, date: row.date, refused: map[string]time.Time{}, until: map[string]time.Time{}}
		s, err := serve(srv)
		if err != nil {
			return nil, err
		}
		client := guarded(true, guardhttp.Config{Name: "retry-after", Retry: guardrail.Retry{
			MaxAttempts: p.maxAttempt,
			Budget:      budget.Unlimited(),
			Backoff:     backoff.Constant(time.Millisecond),
		},
			// 429s count against a breaker (they signal overload); this
			// experiment isolates Retry-After, so the breaker is off.
			Breakers: noBreakers()})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var took []time.Duration
		var ok, refusedAtOnce int
		probe := probeQuiet(ctx)
		for c := range p.clients {
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, row.deadline)
				defer cancel()
				dl, _ := cctx.Deadline()
				start := time.Now()
				req, _ := http.NewRequestWithContext(cctx, http.MethodGet, s.URL, nil)
				req.Header.Set("X-Call", strconv.Itoa(c))
				req.Header.Set("X-Test-Deadline", strconv.FormatInt(dl.UnixNano(), 10))
				resp, err := client.Do(req)
				code := 0
				if err == nil {
					code = resp.StatusCode
					resp.Body.Close()
				}
				mu.Lock()
				defer mu.Unlock()
				took = append(took, time.Since(start))
				switch code {
				case http.StatusOK:
					ok++
				case p.status:
					// guardhttp hands back the server's refusal itself when it
					// will not wait: a status is not an error.
					refusedAtOnce++
				}
			})
		}
		wg.Wait()
		late := probe.stop()
		s.Close()

		srv.mu.Lock()
		earliest := time.Duration(-1)
		for _, g := range srv.gaps {
			if earliest < 0 || g < earliest {
				earliest = g
			}
		}
		retries, early, afterDeadline := len(srv.gaps), srv.early, srv.late
		asked := time.Duration(-1) // what the server allowed, at least: an HTTP-date rounds up
		for id, t := range srv.refused {
			if a := srv.until[id].Sub(t); asked < 0 || a < asked {
				asked = a
			}
		}
		srv.mu.Unlock()
		maxTook := time.Duration(0)
		for _, d := range took {
			maxTook = max(maxTook, d)
		}
		cols := []Col{Ms("asked_ms", asked).Named("asked")}
		if earliest >= 0 {
			cols = append(cols, Ms("earliest_retry_after_ms", earliest).Named("earliest_retry"))
		} else {
			cols = append(cols, Col{Key: "earliest_retry_after_ms", Name: "earliest_retry", Value: nil, Format: "none"})
		}
		cols = append(cols, Int("calls", p.clients), Int("retries", retries), Int("ok", ok), Ms("took_ms", maxTook).Named("slowest"),
			Ms("timer_lateness_p99_ms", late.p99).jsonOnly())
		r.add(row.label, cols...)
		p.checks(r, raRow{honour: row.honour, asked: row.asked, deadline: row.deadline, late: late, retries: retries, early: early,
			afterDeadline: afterDeadline, ok: ok, refusedAtOnce: refusedAtOnce, earliest: earliest, slowest: maxTook})
	}
	r.note("earliest_retry is measured by the server: from writing the refusal to the retry's arrival.")
	return r, nil
}
