package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func TestWriteTable(t *testing.T) {
	rows := []Row{
		{Label: "no jitter", Result: Result{TotalCalls: 5500, RetryPeak: 900, AllDoneAt: 32700 * time.Millisecond}},
		{Label: "full jitter", Result: Result{TotalCalls: 3395, RetryPeak: 419, GaveUp: 7, AllDoneAt: 2549 * time.Millisecond}},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	want := "no jitter       total_calls= 5500 retry_peak/slot= 900 gave_up=   0 all_done_at=32.7s\n" +
		"full jitter     total_calls= 3395 retry_peak/slot= 419 gave_up=   7 all_done_at=2.5s\n"
	if got := b.String(); got != want {
		t.Fatalf("table:\n%s\nwant:\n%s", got, want)
	}
	if got, want := rows[0].String(), strings.TrimSuffix(strings.SplitN(want, "\n", 2)[0], "\n"); got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}

	// A longer label widens the column for every row.
	b.Reset()
	rows[0].Label = "a label longer than fifteen"
	WriteTable(&b, rows)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if i, j := strings.Index(lines[0], "total_calls"), strings.Index(lines[1], "total_calls"); i != j || i != len(rows[0].Label)+1 {
		t.Fatalf("columns not aligned:\n%s", b.String())
	}
}

func TestWriteJSON(t *testing.T) {
	rows, err := Jitter(context.Background(), JitterConfig{PlusJitter: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteJSON(&b, rows); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&b)
	i := 0
	for ; sc.Scan(); i++ {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %d: %v: %s", i, err, sc.Text())
		}
		r := rows[i]
		want := map[string]any{
			"experiment":          "jitter",
			"row":                 r.Label,
			"strategy":            r.Strategy,
			"total_calls":         float64(r.Result.TotalCalls),
			"retry_peak_per_slot": float64(r.Result.RetryPeak),
			"gave_up":             float64(r.Result.GaveUp),
			"all_done_at_ms":      math.Round(float64(r.Result.AllDoneAt)/1e5) / 10,
		}
		for k, v := range want {
			if m[k] != v {
				t.Errorf("line %d: %s = %v, want %v", i, k, m[k], v)
			}
		}
	}
	if i != len(Strategies()) {
		t.Fatalf("%d lines, want %d", i, len(Strategies()))
	}
	if rows[1].Label != "+0..50ms" {
		t.Errorf("plus row labelled %q, want +0..50ms", rows[1].Label)
	}
}

func BenchmarkJitter(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Jitter(ctx, JitterConfig{Config: Config{Seed: 1}}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRun(b *testing.B) {
	ctx := context.Background()
	for _, name := range Strategies() {
		s, _, _ := NewStrategy(name, 0, 0, 0)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Run(ctx, Config{Backoff: s, Seed: 1}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestExponentialPlusAddsSmallJitter(t *testing.T) {
	s := ExponentialPlus(100*time.Millisecond, 10*time.Second, 100*time.Millisecond)
	if got := s.Delay(3, 0, 0.5); got != 850*time.Millisecond {
		t.Errorf("Delay(3, u=0.5) = %v, want 850ms", got)
	}
	for _, u := range []float64{-1, math.NaN(), 2} {
		if got := s.Delay(100, 0, u); got < 10*time.Second || got >= 10*time.Second+100*time.Millisecond {
			t.Errorf("Delay(100, u=%v) = %v, want within [cap, cap+jitter)", u, got)
		}
	}
}
