package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/cmd/guardrail/internal/lab"
)

func TestLabJSONAndExitCodes(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out, errb bytes.Buffer
	// The lab's flags after the experiment's name, mixed with its own.
	code := run(context.Background(), []string{"lab", "amplification", "--json", "--users", "50", "--quick", "--over", "100ms"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	sc := bufio.NewScanner(&out)
	rows, checks, users50 := 0, 0, 0
	for sc.Scan() {
		var obj map[string]any
		if err := json.Unmarshal(sc.Bytes(), &obj); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		if obj["experiment"] != "amplification" {
			t.Fatalf("row of another experiment: %v", obj)
		}
		if _, ok := obj["check"]; ok {
			if obj["verdict"] != "pass" || obj["detail"] == "" {
				t.Errorf("check row %v, want verdict pass and a detail", obj)
			}
			checks++
			continue
		}
		if rows > 0 && checks > 0 {
			t.Errorf("row %v after a check: want the rows first", obj)
		}
		if obj["db_calls"] == nil || obj["per_user"] == nil {
			t.Fatalf("row lacks keys: %v", obj)
		}
		if obj["users"] == 50.0 {
			users50++
		}
		rows++
	}
	if rows != 6 || checks != 6 || users50 != 4 {
		t.Fatalf("%d JSON rows (%d of 50 users) and %d checks, want 6 (4 of --users 50) and 6", rows, users50, checks)
	}

	errb.Reset()
	if code := run(context.Background(), []string{"lab", "nosuch"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unknown experiment") {
		t.Fatalf("unknown experiment: exit %d, %q", code, errb.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"lab", "amplification", "--help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "-tiers") {
		t.Fatalf("lab amplification --help: exit %d, %q", code, out.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"lab", "amplification", "--db", "sideways"}, &out, &errb); code != 2 ||
		errb.String() != "guardrail lab: amplification: --db must be reset or refused, not \"sideways\"\nRun 'guardrail lab amplification --help' for usage.\n" {
		t.Fatalf("bad --db value: exit %d, stderr %q; want 2 and the error with a hint", code, errb.String())
	}
}

// fake is an experiment for the runner's tests: its one check has the
// verdict v, and it records what it was set up and run with.
type fake struct {
	name       string
	v          lab.Verdict
	setupQuick bool // the quick Setup saw (the last time)
	n          int  // its --n flag
	env        *lab.Env
	runs       int
}

func (f *fake) experiment() lab.Experiment {
	return lab.Experiment{Name: f.name, Summary: "a fake whose check is " + f.v.String(),
		Setup: func(fs *flag.FlagSet, quick bool) lab.Run {
			f.setupQuick = quick
			def := 10
			if quick {
				def = 1
			}
			fs.IntVar(&f.n, "n", def, "a count (1 when quick)")
			return func(ctx context.Context, env *lab.Env) (*lab.Result, error) {
				if lab.CheckingOnly(ctx) {
					return nil, nil
				}
				f.env, f.runs = env, f.runs+1
				return &lab.Result{Experiment: f.name, Title: "fake",
					Rows:   []lab.Row{{Label: "only", Cols: []lab.Col{lab.Int("n", f.n)}}},
					Checks: []lab.Check{{Name: "the check", Verdict: f.v, Detail: "why: " + f.v.String()}}}, nil
			}
		}}
}

// useFakes makes the lab's experiments the fakes for the test's duration.
func useFakes(t *testing.T, fakes ...*fake) {
	saved := experiments
	t.Cleanup(func() { experiments = saved })
	experiments = func() []lab.Experiment {
		var out []lab.Experiment
		for _, f := range fakes {
			out = append(out, f.experiment())
		}
		return out
	}
}

func TestLabVerdictsDecideTheExitCode(t *testing.T) {
	pass := &fake{name: "passes", v: lab.Pass}
	unjudged := &fake{name: "unjudged", v: lab.NotJudged}
	failing := &fake{name: "fails", v: lab.Fail}
	useFakes(t, pass, unjudged, failing)

	code, out, errOut := runCmd(t, "lab", "unjudged")
	if code != 0 {
		t.Fatalf("a check not judged: exit %d, want 0; stderr:\n%s", code, errOut)
	}
	if !strings.Contains(out, "[not judged] the check: why: not_judged") || !strings.Contains(errOut, "1 check(s) not judged") ||
		!strings.Contains(errOut, "unjudged: the check") || !strings.Contains(errOut, "1 check(s): 0 pass, 0 fail, 1 not judged") || strings.Contains(errOut, "failed") {
		t.Errorf("a check not judged:\nstdout %q\nstderr %q", out, errOut)
	}

	code, out, errOut = runCmd(t, "lab", "passes", "unjudged", "fails")
	if code != 1 {
		t.Fatalf("a failed check: exit %d, want 1; stderr:\n%s", code, errOut)
	}
	if !strings.Contains(out, "[FAIL] the check") || !strings.Contains(out, "[pass] the check") ||
		!strings.Contains(errOut, "3 experiment(s) in ") || !strings.Contains(errOut, "3 check(s): 1 pass, 1 fail, 1 not judged\n") ||
		!strings.Contains(errOut, "1 check(s) failed:\n  fails: the check: why: fail") {
		t.Errorf("a failed check:\nstdout %q\nstderr %q", out, errOut)
	}

	code, out, _ = runCmd(t, "lab", "--json", "passes", "unjudged", "fails")
	if code != 1 {
		t.Fatalf("--json with a failed check: exit %d, want 1", code)
	}
	type line struct {
		Experiment string `json:"experiment"`
		Row        string `json:"row"`
		Check      string `json:"check"`
		Verdict    string `json:"verdict"`
		Detail     string `json:"detail"`
	}
	var got []line
	for l := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var x line
		if err := json.Unmarshal([]byte(l), &x); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		got = append(got, x)
	}
	want := []line{
		{Experiment: "passes", Row: "only"}, {Experiment: "passes", Check: "the check", Verdict: "pass", Detail: "why: pass"},
		{Experiment: "unjudged", Row: "only"}, {Experiment: "unjudged", Check: "the check", Verdict: "not_judged", Detail: "why: not_judged"},
		{Experiment: "fails", Row: "only"}, {Experiment: "fails", Check: "the check", Verdict: "fail", Detail: "why: fail"},
	}
	if len(got) != len(want) {
		t.Fatalf("JSON lines %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("JSON line %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestLabFlagsBeforeAndAfterNames(t *testing.T) {
	a, b := &fake{name: "a", v: lab.Pass}, &fake{name: "b", v: lab.Pass}
	useFakes(t, a, b)
	for _, args := range [][]string{
		{"lab", "--quick", "--json", "--seed", "7", "a", "--n", "5"},
		{"lab", "a", "--n", "5", "--quick", "--json", "--seed", "7"},
		{"lab", "a", "--json", "--n=5", "-quick", "--seed=7"},
		{"lab", "--seed", "7", "a", "-n", "5", "--quick=true", "-json"},
	} {
		a.runs, a.env = 0, nil
		code, out, errOut := runCmd(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		if a.runs != 1 || a.env == nil || !a.env.Quick || a.env.Seed != 7 || a.n != 5 || !a.setupQuick {
			t.Errorf("%v: runs %d, env %+v, n %d, set up quick %v; want 1 run, quick, seed 7, n 5, quick defaults",
				args, a.runs, a.env, a.n, a.setupQuick)
		}
		if !strings.HasPrefix(out, `{"experiment":"a","row":"only","n":5}`) {
			t.Errorf("%v: stdout %q, want JSON", args, out)
		}
	}
	// --quick after a name shrinks every experiment's defaults, also those
	// of experiments named before it.
	code, out, _ := runCmd(t, "lab", "a", "b", "--quick")
	if code != 0 || a.n != 1 || b.n != 1 || !strings.Contains(out, "n=1") {
		t.Errorf("lab a b --quick: exit %d, n %d and %d; want the quick default 1:\n%s", code, a.n, b.n, out)
	}
	// Each experiment's flags follow its name.
	code, _, errOut := runCmd(t, "lab", "a", "--n", "3", "b", "--n", "4")
	if code != 0 || a.n != 3 || b.n != 4 {
		t.Errorf("lab a --n 3 b --n 4: exit %d, n %d and %d: %s", code, a.n, b.n, errOut)
	}
	// "--" ends the flags: what follows are names.
	a.runs, b.runs = 0, 0
	if code, _, errOut := runCmd(t, "lab", "--quick", "--", "a", "b"); code != 0 || a.runs != 1 || b.runs != 1 {
		t.Errorf("lab --quick -- a b: exit %d, runs %d and %d: %s", code, a.runs, b.runs, errOut)
	}
	if code, _, errOut := runCmd(t, "lab", "a", "--", "--n"); code != 2 || !strings.Contains(errOut, `unknown experiment "--n"`) {
		t.Errorf("lab a -- --n: exit %d, stderr %q; want an unknown experiment", code, errOut)
	}
	// No name runs them all.
	a.runs, b.runs = 0, 0
	if code, _, errOut := runCmd(t, "lab", "--quick"); code != 0 || a.runs != 1 || b.runs != 1 {
		t.Errorf("lab --quick: exit %d, runs %d and %d: %s", code, a.runs, b.runs, errOut)
	}
	// An experiment's flag before its name says where it goes.
	code, out, errOut = runCmd(t, "lab", "--n", "3", "a")
	if want := "guardrail lab: flag provided but not defined: -n (--n is a flag of a, b: put it after the experiment's name)\nRun 'guardrail lab --help' for usage.\n"; code != 2 || out != "" || errOut != want {
		t.Errorf("lab --n 3 a: exit %d, stdout %q, stderr %q; want 2 and %q", code, out, errOut, want)
	}
}

func TestLabHelp(t *testing.T) {
	for _, args := range [][]string{{"lab", "-h"}, {"lab", "--help"}, {"help", "lab"}, {"lab", "--quick", "-help"}} {
		code, out, errOut := runCmd(t, args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: guardrail lab [flags]") ||
			!strings.Contains(out, "-report string") || !strings.Contains(out, "Exit status: 0") {
			t.Errorf("%v: exit %d, stderr %q, stdout:\n%s", args, code, errOut, out)
		}
		for _, e := range lab.Experiments() {
			if !strings.Contains(out, "  "+e.Name+" ") {
				t.Errorf("%v: experiment %s not listed", args, e.Name)
			}
		}
	}
	for _, e := range lab.Experiments() {
		for _, h := range []string{"-h", "--help"} {
			code, out, errOut := runCmd(t, "lab", e.Name, h)
			if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: guardrail lab "+e.Name+" [flags]") ||
				!strings.Contains(out, e.Summary) || !strings.Contains(out, "Exit status: 0") {
				t.Errorf("lab %s %s: exit %d, stderr %q, stdout:\n%s", e.Name, h, code, errOut, out)
			}
		}
	}
}

func TestLabReport(t *testing.T) {
	useFakes(t, &fake{name: "unjudged", v: lab.NotJudged})
	file := filepath.Join(t.TempDir(), "lab.html")
	code, _, errOut := runCmd(t, "lab", "unjudged", "--report", file)
	if code != 0 || !strings.Contains(errOut, "report written to "+file) {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	page, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), `<li class="unjudged">– not judged: the check: why: not_judged</li>`) {
		t.Errorf("the report does not show the check as not judged")
	}
}

// A bad flag of the last experiment selected is refused before the first
// runs.
func TestLabChecksEveryFlagFirst(t *testing.T) {
	code, out, errOut := runCmd(t, "lab", "jitter", "shedding", "--slots", "0")
	if code != 2 || !strings.Contains(errOut, "shedding: ") {
		t.Fatalf("exit %d, stderr %q; want 2 and shedding's flag error", code, errOut)
	}
	if out != "" {
		t.Fatalf("jitter ran before shedding's flags were checked:\n%s", out)
	}
}

// Without a Redis the fleet experiment judges nothing, and the lab still
// exits 0: its first command works on a machine that has only Go.
func TestLabFleetWithoutRedis(t *testing.T) {
	t.Setenv("GUARDRAIL_LAB_REDIS_ADDR", "")
	code, out, errOut := runCmd(t, "lab", "fleet", "--quick")
	if code != 0 || !strings.Contains(out, "[not judged] limiter:") || !strings.Contains(out, "no Redis: set --redis or GUARDRAIL_LAB_REDIS_ADDR") ||
		!strings.Contains(errOut, "7 check(s): 0 pass, 0 fail, 7 not judged") {
		t.Errorf("lab fleet without Redis: exit %d, stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
