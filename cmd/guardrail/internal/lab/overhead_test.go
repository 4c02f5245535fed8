package lab

import (
	"slices"
	"strings"
	"testing"
)

// TestWallCheck: a median within the target by more than its uncertainty
// passes, one over it by more fails; rounds too noisy to tell, or too few
// of them, are not judged.
func TestWallCheck(t *testing.T) {
	if raceEnabled {
		t.Skip("a race build judges no wall time")
	}
	// The cases are written for a target of 1.10x; shift moves them to
	// wallTarget.
	const shift = wallTarget - 1.10
	rounds := func(n int, lo, hi float64) []float64 { // n ratios from lo to hi, sorted
		out := make([]float64, n)
		for i := range out {
			out[i] = shift + lo + (hi-lo)*float64(i)/float64(max(1, n-1))
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		ratios []float64
		want   Verdict
	}{
		{"within", rounds(40, 0.98, 1.12), Pass},
		{"at the target, steady", rounds(40, 1.10, 1.10), Pass},
		{"over", rounds(40, 1.15, 1.30), Fail},
		{"over, noisy", rounds(40, 0.60, 1.80), NotJudged},            // median 1.2 ± 0.18
		{"within, noisy", rounds(200, 0.40, 1.80), NotJudged},         // median 1.1 ± 0.09
		{"over, noisy, many rounds", rounds(20000, 0.60, 1.80), Fail}, // ± 0.02: the error shrinks as 1/sqrt(n)
		{"straddling", rounds(40, 0.90, 1.40), NotJudged},             // median 1.15 ± 0.07
		{"too few rounds", rounds(wallMinRounds-1, 1.3, 1.4), NotJudged},
		{"no rounds", nil, NotJudged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := wallCheck("w", tc.ratios)
			if c.Verdict != tc.want {
				t.Errorf("verdict %v (%s), want %v", c.Verdict, c.Detail, tc.want)
			}
		})
	}
}

// TestOverheadMarks: each guarded row's numbers carry the verdict of the
// check that held them to their target, the baselines' carry none, and a
// row whose checks were not judged is faded in the chart.
func TestOverheadMarks(t *testing.T) {
	res := runExp(t, "overhead", "--rounds", "4", "--block", "10")
	verdict := map[string]Verdict{}
	for _, c := range res.Checks {
		verdict[c.Name] = c.Verdict
	}
	series := res.Charts[0].Series[0]
	for i, row := range res.Rows {
		unjudged := false
		for _, c := range row.Cols {
			if c.Key != "slower_pct" && c.Key != "extra_allocs" {
				if c.judged {
					t.Errorf("%s: %s carries a verdict", row.Label, c.Key)
				}
				continue
			}
			guarded := i == 1 || i == 3
			if c.judged != guarded {
				t.Errorf("%s: %s judged %v, want %v", row.Label, c.Key, c.judged, guarded)
				continue
			}
			if !guarded {
				continue
			}
			prefix := row.Label + " within " + overheadTarget
			if c.Key == "extra_allocs" {
				prefix = row.Label + " allocates at most 10 more"
			}
			idx := slices.IndexFunc(res.Checks, func(k Check) bool { return strings.HasPrefix(k.Name, prefix) })
			if idx < 0 {
				t.Fatalf("%s: no check %q… in %v", row.Label, prefix, res.Checks)
			}
			if want := res.Checks[idx].Verdict; c.verdict != want {
				t.Errorf("%s: %s marked %v, its check says %v", row.Label, c.Key, c.verdict, want)
			}
			if !strings.HasSuffix(c.text(), "["+c.verdict.mark()+"]") {
				t.Errorf("%s: table shows %q, want the verdict beside the number", row.Label, c.text())
			}
			unjudged = unjudged || res.Checks[idx].Verdict == NotJudged
		}
		if got := i < len(series.NotJudged) && series.NotJudged[i]; got != unjudged {
			t.Errorf("%s: chart point not judged %v, want %v", row.Label, got, unjudged)
		}
	}
	// Four rounds cannot judge a wall time: those points are faded.
	if !series.NotJudged[1] || !series.NotJudged[3] {
		t.Errorf("chart marks %v, want the guarded rows (4 rounds) not judged", series.NotJudged)
	}
}
