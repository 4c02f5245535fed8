package lab

import (
	"testing"
	"time"
)

// The hedging and throttling experiments on a shortened run: the rows
// carry the keys the JSON output promises, and no check fails (a busy
// machine makes them not judged instead).
func TestHedging(t *testing.T) {
	res := runExpTries(t, 3, "hedging", "--calls", "600", "--workers", "8")
	if len(res.Rows) != 4 {
		t.Fatalf("%d rows, want 4", len(res.Rows))
	}
	for i, r := range res.Rows {
		if got, want := col(t, r, "hedging").(bool), i%2 == 1; got != want {
			t.Errorf("%s: hedging %v", r.Label, got)
		}
		if got, want := col(t, r, "overloaded").(bool), i >= 2; got != want {
			t.Errorf("%s: overloaded %v", r.Label, got)
		}
		p50, p99 := col(t, r, "p50_ms").(time.Duration), col(t, r, "p99_ms").(time.Duration)
		if p50 <= 0 || p99 < p50 {
			t.Errorf("%s: p50 %v p99 %v", r.Label, p50, p99)
		}
		if extra := col(t, r, "extra_requests_pct").(float64); extra < 0 || (i%2 == 0 && extra != 0) {
			t.Errorf("%s: %.1f %% extra requests", r.Label, extra)
		}
	}
}

func TestThrottling(t *testing.T) {
	res := runExpTries(t, 3, "throttling", "--phase", "3s", "--settle", "2s", "--window", "2s")
	if len(res.Rows) != 6 {
		t.Fatalf("%d rows, want 6", len(res.Rows))
	}
	for _, r := range res.Rows {
		col(t, r, "phase")
		col(t, r, "backend_load_pct_of_capacity")
		col(t, r, "client_success_pct")
		col(t, r, "breaker_flaps")
	}
	if none := col(t, res.Rows[1], "backend_load_pct_of_capacity").(float64); none < 150 {
		t.Errorf("no protection put %.0f %% of capacity on the halved backend; want about 180", none)
	}
}
