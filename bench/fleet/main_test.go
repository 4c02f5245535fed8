package main

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// The harness re-executes its own binary as each process of the
	// fleet; under go test that binary is this one.
	if cfg := os.Getenv(childEnv); cfg != "" {
		if err := childMain(cfg, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A short run of both implementations on four OS processes: the rows
// parse, and each admits about the limit.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts OS processes against Redis")
	}
	if os.Getenv("GUARDRAIL_TEST_REDIS_ADDR") == "" {
		t.Skip("GUARDRAIL_TEST_REDIS_ADDR is not set: set it to a Redis server (for example 127.0.0.1:6379) to run the fleet benchmark's smoke test")
	}
	var out, errs bytes.Buffer
	err := run([]string{"-processes", "4", "-limit", "400", "-burst", "80", "-offered", "1200",
		"-duration", "3s", "-warmup", "1s", "-outage=false"}, &out, &errs)
	if err != nil {
		t.Fatalf("%v\n%s", err, errs.String())
	}
	dec := json.NewDecoder(&out)
	seen := map[string]bool{}
	for dec.More() {
		var r row
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		seen[r.Impl] = true
		if r.Processes != 4 || r.AdmittedRPS < 340 || r.AdmittedRPS > 460 {
			t.Errorf("%s: %+v, want about 400 admitted a second", r.Impl, r)
		}
		if r.Impl == "redis_rate" && r.RoundTripsPerOffered < 0.99 {
			t.Errorf("redis_rate paid %.3f round trips per request; the counter misses some", r.RoundTripsPerOffered)
		}
	}
	if !seen["guardrail"] || !seen["redis_rate"] {
		t.Errorf("rows for %v, want both implementations", seen)
	}
}
