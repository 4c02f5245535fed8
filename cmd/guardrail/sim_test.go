package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

var simLine = regexp.MustCompile(`^(.{15,}) total_calls=\s*(\d+) retry_peak/slot=\s*(\d+) gave_up=\s*(\d+) all_done_at=(\d+\.\d)s$`)

func TestSimTable(t *testing.T) {
	code, out, errOut := runCmd(t, "sim")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines, want one per strategy:\n%s", len(lines), out)
	}
	if want := "no jitter       total_calls= 5500 retry_peak/slot= 900 gave_up=   0 all_done_at=32.7s"; lines[0] != want {
		t.Errorf("first line\n%q, want\n%q", lines[0], want)
	}
	labels := []string{"no jitter", "+0..100ms", "equal jitter", "full jitter", "decorrelated"}
	for i, l := range lines {
		m := simLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %q is not in the table's shape", l)
		}
		if got := strings.TrimSpace(m[1]); got != labels[i] {
			t.Errorf("row %d labelled %q, want %q", i, got, labels[i])
		}
	}

	// The same seed prints the same table; another seed other jittered rows.
	_, again, _ := runCmd(t, "sim")
	_, other, _ := runCmd(t, "sim", "--seed", "2")
	if again != out {
		t.Errorf("two runs with the default seed differ:\n%s\n%s", out, again)
	}
	otherLines := strings.Split(other, "\n")
	if otherLines[0] != lines[0] || other == out {
		t.Errorf("seed 2: no jitter should stay, jittered rows should change:\n%s", other)
	}
}

func TestSimJSON(t *testing.T) {
	code, out, errOut := runCmd(t, "sim", "--json", "--strategies", "none, full", "--clients", "500", "--seed", "9")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	type record struct {
		Experiment       string   `json:"experiment"`
		Row              string   `json:"row"`
		Strategy         string   `json:"strategy"`
		TotalCalls       *int     `json:"total_calls"`
		RetryPeakPerSlot *int     `json:"retry_peak_per_slot"`
		GaveUp           *int     `json:"gave_up"`
		AllDoneAtMS      *float64 `json:"all_done_at_ms"`
	}
	var recs []record
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r record
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if r.TotalCalls == nil || r.RetryPeakPerSlot == nil || r.GaveUp == nil || r.AllDoneAtMS == nil {
			t.Fatalf("line %q lacks a column", sc.Text())
		}
		recs = append(recs, r)
	}
	if len(recs) != 2 || recs[0].Strategy != "none" || recs[1].Strategy != "full" {
		t.Fatalf("records %+v, want none then full", recs)
	}
	// 500 clients, 100 per slot: waves of 500..100 at 0, .1, .3, .7, 1.5 s.
	none := recs[0]
	if none.Experiment != "jitter" || none.Row != "no jitter" || *none.TotalCalls != 1500 ||
		*none.RetryPeakPerSlot != 400 || *none.GaveUp != 0 || *none.AllDoneAtMS != 1500 {
		t.Errorf("no jitter record %+v: calls %d peak %d gave up %d done %vms; want 1500 400 0 1500",
			none, *none.TotalCalls, *none.RetryPeakPerSlot, *none.GaveUp, *none.AllDoneAtMS)
	}
}

func TestSimScenarioFlags(t *testing.T) {
	calls := func(t *testing.T, args ...string) (total, gaveUp int) {
		t.Helper()
		code, out, errOut := runCmd(t, append([]string{"sim", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var r struct {
			TotalCalls int `json:"total_calls"`
			GaveUp     int `json:"gave_up"`
		}
		if err := json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &r); err != nil {
			t.Fatal(err)
		}
		return r.TotalCalls, r.GaveUp
	}
	// A dead server: every attempt fails, every client gives up.
	if total, gaveUp := calls(t, "--capacity", "0", "--max-attempts", "3", "--strategies", "full"); total != 3000 || gaveUp != 1000 {
		t.Errorf("dead server: %d calls, %d gave up; want 3000, 1000", total, gaveUp)
	}
	// The same with a 10 % budget: 1000 first calls and 10+100 retries at most.
	if total, _ := calls(t, "--capacity", "0", "--max-attempts", "3", "--strategies", "full", "--budget-ratio", "0.1"); total > 1110 {
		t.Errorf("dead server with budget: %d calls, want at most 1110", total)
	}
	// An outage of 1 s: the no-jitter waves before 1.5 s all fail.
	if total, gaveUp := calls(t, "--down", "1s", "--strategies", "none"); total != 8500 || gaveUp != 400 {
		t.Errorf("outage: %d calls, %d gave up; want 8500, 400", total, gaveUp)
	}
	// A 1 s deadline stops the no-jitter waves after 0.7 s.
	if total, gaveUp := calls(t, "--deadline", "1s", "--strategies", "none"); total != 3400 || gaveUp != 600 {
		t.Errorf("deadline: %d calls, %d gave up; want 3400, 600", total, gaveUp)
	}
	// Spread arrivals with ample capacity: one call each.
	if total, _ := calls(t, "--spread", "10s", "--capacity", "1000"); total != 1000 {
		t.Errorf("spread: %d calls, want 1000", total)
	}
	if total, _ := calls(t, "--rate", "50", "--capacity", "1000"); total != 1000 {
		t.Errorf("poisson: %d calls, want 1000", total)
	}
}

func TestSimUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--bogus"},
		{"--clients", "0"},
		{"--capacity", "-1"},
		{"--slot", "0"},
		{"--base", "1s", "--cap", "100ms"},
		{"--max-attempts", "0"},
		{"--budget-ratio", "-1"},
		{"--budget-ratio", "0.1", "--budget-max", "0.5"},
		{"--spread", "1s", "--rate", "10"},
		{"--rate", "NaN"},
		{"--strategies", "full,nope"},
		{"--strategies", " , "},
		{"extra"},
	} {
		code, out, errOut := runCmd(t, append([]string{"sim"}, args...)...)
		if code != 2 || out != "" || !strings.Contains(errOut, "guardrail sim:") {
			t.Errorf("sim %v: exit %d, stdout %q, stderr %q; want exit 2 and an error", args, code, out, errOut)
		}
	}
	code, out, errOut := runCmd(t, "sim", "--help")
	if code != 0 || errOut != "" || !strings.Contains(out, "-strategies") {
		t.Errorf("--help: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
