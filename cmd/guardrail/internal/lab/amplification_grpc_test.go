package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/breaker"
)

// checkAmpRows checks the DB calls of each amplification row, run with
// --attempts 3 over users users, and that every row names transport.
func checkAmpRows(t *testing.T, res *Result, users int, transport string) {
	t.Helper()
	// -1: budgeted, -2: breaker, checked below.
	want := []int{27, 3, -1, -1, 3 * users, -2}
	if len(res.Rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(res.Rows), len(want))
	}
	for i, r := range res.Rows {
		if got := col(t, r, "transport"); got != transport {
			t.Errorf("%s: transport %v, want %s", r.Label, got, transport)
		}
		calls := col(t, r, "db_calls").(int)
		per := col(t, r, "per_user").(float64)
		switch want[i] {
		case -1:
			// The bucket starts with 10 tokens and earns 0.1 per user;
			// the experiment's check allows 0.2 per user more.
			if lo, hi := users, users+users/10+10+users/5; calls < lo || calls > hi {
				t.Errorf("%s: %d DB calls, want %d-%d at ratio 0.1", r.Label, calls, lo, hi)
			}
		case -2:
			if breakerNotJudged(res) {
				t.Logf("%s: not judged: the machine was too busy", r.Label)
				continue
			}
			if limit := 4 * breaker.DefaultMinRequests; calls > limit {
				t.Errorf("%s: %d DB calls (per_user %.3f), want at most %d", r.Label, calls, per, limit)
			}
		default:
			if calls != want[i] {
				t.Errorf("%s: %d DB calls, want %d", r.Label, calls, want[i])
			}
		}
	}
	for _, c := range res.Checks {
		if c.Verdict == NotJudged && c.Name == ampBreakerCheck {
			continue
		}
		if c.Verdict != Pass {
			t.Errorf("check %s: %s: %s", c.Name, c.Verdict, c.Detail)
		}
	}
}

// breakerNotJudged reports whether res's breaker check was not judged.
func breakerNotJudged(res *Result) bool {
	for _, c := range res.NotJudged() {
		if c.Name == ampBreakerCheck {
			return true
		}
	}
	return false
}

// TestAmplificationGRPC runs the rows over gRPC: every tier a gRPC server
// calling the next through a guardgrpc client. The DB counts each
// connection it accepts and resets, so every attempt of the data-service
// must reach it: 3^3 with every tier retrying, 3 with one, the budget's
// and the breaker's bounds as over HTTP.
func TestAmplificationGRPC(t *testing.T) {
	const users = 200
	// Spread over a second: the breaker trips once it has seen its
	// minimum volume, which a loaded machine delays when the users come
	// faster than their calls end. Tries: as for the other experiments
	// timed on real sockets.
	res := runExpTries(t, 3, "amplification", "--transport", "grpc", "--users", "200", "--over", "1s", "--attempts", "3")
	checkAmpRows(t, res, users, "grpc")
	if !strings.Contains(res.Title, "gRPC") {
		t.Errorf("title %q does not say gRPC", res.Title)
	}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, res); err != nil {
		t.Fatal(err)
	}
	rows := 0
	for line := range strings.Lines(buf.String()) {
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if _, ok := obj["row"]; !ok {
			continue
		}
		rows++
		if obj["transport"] != "grpc" {
			t.Errorf("JSON row %s: transport %v, want grpc", line, obj["transport"])
		}
	}
	if rows != len(res.Rows) {
		t.Errorf("%d JSON rows, want %d", rows, len(res.Rows))
	}
}

// TestAmplificationGRPCRefused: with nothing listening, the calls are
// counted at the data-service's dialer, one per attempt.
func TestAmplificationGRPCRefused(t *testing.T) {
	const users = 100
	res := runExpTries(t, 3, "amplification", "--transport", "grpc", "--db", "refused", "--users", "100", "--over", "1s", "--attempts", "3")
	checkAmpRows(t, res, users, "grpc")
}

// TestAmplificationHTTPTransportColumn: the HTTP rows, the default, say so.
func TestAmplificationHTTPTransportColumn(t *testing.T) {
	res := runExpTries(t, 3, "amplification", "--users", "50", "--over", "250ms", "--attempts", "3")
	checkAmpRows(t, res, 50, "http")
}

func TestAmplificationTransportFlag(t *testing.T) {
	for _, tr := range []string{"http", "grpc"} {
		p, run := bindExp(t, "amplification", false, "--transport", tr)
		if err := p.checkFlags(); err != nil {
			t.Errorf("--transport %s: %v", tr, err)
		}
		if err := CheckFlags(run); err != nil {
			t.Errorf("--transport %s: the Run refuses it: %v", tr, err)
		}
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--transport", "quic"}, []string{`--transport must be http or grpc, not "quic"`}},
		{[]string{"--transport", ""}, []string{`--transport must be http or grpc, not ""`}},
		{[]string{"--transport", "GRPC"}, []string{`not "GRPC"`}},
		// Every invalid flag is named, not only the first.
		{[]string{"--transport", "h2", "--db", "sideways"}, []string{`--transport must be http or grpc, not "h2"`, `--db must be reset or refused, not "sideways"`}},
	} {
		_, run := bindExp(t, "amplification", false, tc.args...)
		err := CheckFlags(run)
		var fe *FlagError
		if !errors.As(err, &fe) {
			t.Errorf("%q: got %v, want a *FlagError", tc.args, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(fe.Msg, w) {
				t.Errorf("%q: message %q does not say %q", tc.args, fe.Msg, w)
			}
		}
	}
}

// TestAmplificationCancelled: a run cancelled while the users' requests
// are spread over an hour returns at once with the context's error, over
// either transport, and leaves no goroutine behind (the spread rows wait
// for the requests they started before the servers close).
func TestAmplificationCancelled(t *testing.T) {
	for _, tr := range []string{"http", "grpc"} {
		t.Run(tr, func(t *testing.T) {
			_, run := bindExp(t, "amplification", true, "--transport", tr, "--users", "100", "--over", "1h")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			env := &Env{Quick: true, Seed: 1, Progress: func(format string, args ...any) {
				// Row 4 is the first whose users are spread.
				if strings.HasPrefix(fmt.Sprintf(format, args...), "amplification: row 4/") {
					cancel()
				}
			}}
			if _, err := run(ctx, env); !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want context.Canceled", err)
			}
			goleak.VerifyNone(t)
		})
	}
}

// TestJudgeBreakerRow: the breaker row fails when too many calls reach the
// DB while the data-service held few at once, and is not judged when the
// users came faster than their calls ended (a loaded machine).
func TestJudgeBreakerRow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls int64
		peak  int64
		want  Verdict
	}{
		{"tripped", 20, 5, Pass},
		{"tripped though many at once", 60, 300, Pass},
		{"never tripped, few at once", 112, 5, Fail},
		{"never tripped, at the bound", 112, ampMaxInFlight, Fail},
		{"many at once", 112, ampMaxInFlight + 1, NotJudged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Result{}
			judgeBreakerRow(r, tc.calls, float64(tc.calls)/100, 1.15, tc.peak)
			if len(r.Checks) != 1 || r.Checks[0].Verdict != tc.want {
				t.Fatalf("checks %+v, want one %s", r.Checks, tc.want)
			}
		})
	}
}

func TestInFlightPeak(t *testing.T) {
	var f inFlight
	a := f.enter()
	b := f.enter()
	b()
	c := f.enter()
	c()
	a()
	if got, now := f.peak.Load(), f.now.Load(); got != 2 || now != 0 {
		t.Errorf("peak %d, now %d; want 2 and 0", got, now)
	}
}
