package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The harness re-executes its own binary as the load generator; under
	// go test that binary is this one.
	if cfg := os.Getenv(loadgenEnv); cfg != "" {
		loadgenMain(cfg)
		return
	}
	goleak.VerifyTestMain(m)
}

// smokeWorkload is the real schedule at a tenth of the length.
var smokeWorkload = workload{Slots: []int{10, 5, 20}, Phase: 300 * time.Millisecond, Hold: 50 * time.Millisecond}

// One short run end to end: the server sees every request the load
// generator sends, and both sides agree on what was answered how.
func TestSmokeRunCounts(t *testing.T) {
	const rps = 100 // half the first phase's capacity, the second's capacity
	res, err := runOnce(limiterSpec{Name: "fixed", Fixed: 10}, smokeWorkload, rps, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wantSent := int(rps * smokeWorkload.total().Seconds())
	if res.Records != wantSent {
		t.Fatalf("load generator sent %d requests, want %d", res.Records, wantSent)
	}
	if res.Dials < 1 || res.Dials > int64(wantSent) {
		t.Errorf("load generator opened %d connections for %d requests", res.Dials, wantSent)
	}
	var sent, ok int
	for _, p := range res.Phases {
		sent += p.Sent
		ok += p.OK
	}
	var arrived, rejected, abandoned, served, gone int64
	for i, c := range res.Server {
		arrived += c.Arrived
		rejected += c.Rejected
		abandoned += c.Abandoned
		served += c.OK
		gone += c.OKGone
		if c.Arrived == 0 || c.OK == 0 {
			t.Errorf("phase %d: server saw %+v, want arrivals and 200s in every phase", i+1, c)
		}
	}
	if sent != wantSent {
		t.Errorf("phases hold %d requests, want %d", sent, wantSent)
	}
	if arrived != int64(wantSent) {
		t.Errorf("server saw %d requests arrive, want every one of the %d sent", arrived, wantSent)
	}
	if arrived != rejected+abandoned+served {
		t.Errorf("server: %d arrived but %d rejected + %d abandoned + %d served", arrived, rejected, abandoned, served)
	}
	if int64(ok) != served-gone {
		t.Errorf("client counted %d 200s, server served %d of which %d to a client gone", ok, served, gone)
	}
	// The fixed limit is sampled every 50 ms over the whole schedule.
	if n := len(res.Samples); n < 10 {
		t.Errorf("%d limit samples over %v, want about %d", n, smokeWorkload.total(), smokeWorkload.total()/sampleEvery)
	}
	for _, s := range res.Samples {
		if s.Limit != 10 {
			t.Fatalf("sample %+v: limit %d, want the fixed 10", s, s.Limit)
		}
	}
	if last := res.Samples[len(res.Samples)-1]; last.Slots != 20 {
		t.Errorf("last sample %+v: pool of %d slots, want 20 after the schedule", last, last.Slots)
	}
}

// The command end to end, at the smoke scale: the table and JSON rows.
func TestSmokeCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.json")
	md := filepath.Join(t.TempDir(), "out.md")
	var stdout bytes.Buffer
	err := run([]string{
		"-limiters", "fixed=10", "-overloads", "0.5", "-runs", "1",
		"-phase", "300ms", "-json", out, "-md", md,
	}, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "fixed=10") {
		t.Errorf("table has no fixed=10 row:\n%s", stdout.String())
	}
	m, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(m), "| fixed=10 | 0.5x |") {
		t.Errorf("Markdown has no fixed=10 row:\n%s", m)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(b, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("%d JSON rows, want one per phase (3)", len(rows))
	}
	for i, r := range rows {
		for _, k := range []string{"row", "limiter", "limit", "overload", "phase", "slots",
			"goodput_pct_of_capacity", "p99_ok_ms", "converge_ms", "judged"} {
			if _, ok := r[k]; !ok {
				t.Errorf("row %d has no %q: %v", i+1, k, r)
			}
		}
		if r["limiter"] != "fixed=10" || r["limit"] != 10.0 || r["overload"] != 0.5 || r["phase"] != float64(i+1) {
			t.Errorf("row %d = %v", i+1, r)
		}
	}
}

func TestParseLimiters(t *testing.T) {
	got, err := parseLimiters("guardrail, failsafe,gradient2,vegas,fixed=10,none")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range got {
		names = append(names, s.String())
	}
	if strings.Join(names, ",") != "guardrail,failsafe,gradient2,vegas,fixed=10,none" {
		t.Errorf("parsed %v", names)
	}
	for _, bad := range []string{"", "fixed=0", "fixed=x", "gradient"} {
		if _, err := parseLimiters(bad); err == nil {
			t.Errorf("parseLimiters(%q) accepted", bad)
		}
	}
	for _, s := range got {
		if _, err := newLimiter(s); err != nil {
			t.Errorf("newLimiter(%v): %v", s, err)
		}
	}
}
