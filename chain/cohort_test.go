package chain_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/chain"
)

func TestCohortOf(t *testing.T) {
	now := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	counts := make([]int, chain.Cohorts)
	moved := 0
	for i := range 10000 {
		key := "user-" + strconv.Itoa(i)
		c := chain.CohortOf(key, now, 0)
		if c < 0 || c >= chain.Cohorts {
			t.Fatalf("CohortOf(%q) = %d", key, c)
		}
		counts[c]++
		if again := chain.CohortOf(key, now.Add(30*time.Minute), 0); again != c {
			t.Fatalf("%q changed cohort within its hour: %d then %d", key, c, again)
		}
		if chain.CohortOf(key, now.Add(time.Hour), 0) != c {
			moved++
		}
	}
	// 10000 keys over 128 cohorts: about 78 each.
	for c, n := range counts {
		if n < 30 || n > 140 {
			t.Errorf("cohort %d has %d of 10000 keys, want about 78", c, n)
		}
	}
	if moved < 9000 {
		t.Errorf("%d of 10000 keys drew another cohort the next hour, want almost all", moved)
	}
}

func FuzzParseCohortAndAdmission(f *testing.F) {
	for _, s := range []string{"0", "127", "128", " 5 ", "-1", "1e2", "0128", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if c, ok := chain.ParseCohort(s); ok && (c < 0 || c >= chain.Cohorts) {
			t.Fatalf("ParseCohort(%q) = %d", s, c)
		}
		if l, ok := chain.ParseAdmission(s); ok && (l < 0 || l > chain.Cohorts) {
			t.Fatalf("ParseAdmission(%q) = %d", s, l)
		}
	})
}

// An edge derives the cohort from its Key, refuses at the door the cohorts
// below the admission level (not processed), and tells every caller the
// level.
func TestMiddlewareRefusesBelowTheLevel(t *testing.T) {
	now := time.Now()
	var low, high string
	for i := 0; low == "" || high == ""; i++ {
		key := "u" + strconv.Itoa(i)
		switch c := chain.CohortOf(key, now, 0); {
		case c < 40 && low == "":
			low = key
		case c >= 60 && high == "":
			high = key
		}
	}
	ran := 0
	cs, err := chain.New(chain.Config{
		Key:       func(r *http.Request) string { return r.Header.Get("User") },
		Admission: func() int { return 50 },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := cs.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		if _, ok := chain.FromContext(r.Context()).Cohort(); !ok {
			t.Error("the handler's request has no cohort")
		}
	}))
	for _, tc := range []struct {
		user     string
		code     int
		unproc   string
		handlers int
	}{{low, http.StatusServiceUnavailable, "1", 0}, {high, http.StatusOK, "", 1}} {
		ran = 0
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("User", tc.user)
		r.Header.Set(chain.HeaderCohort, "127") // ignored at an edge: Key decides
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code || w.Header().Get(chain.HeaderNotProcessed) != tc.unproc || ran != tc.handlers {
			t.Errorf("%s: %d, not processed %q, handler ran %d; want %d, %q, %d", tc.user, w.Code, w.Header().Get(chain.HeaderNotProcessed), ran, tc.code, tc.unproc, tc.handlers)
		}
		if got := w.Header().Get(chain.HeaderAdmission); got != "50" {
			t.Errorf("%s: %s = %q, want 50 on every answer", tc.user, chain.HeaderAdmission, got)
		}
	}
}

func TestLevels(t *testing.T) {
	var l chain.Levels
	t0 := time.Unix(1000, 0)
	l.Note("a", "", false, t0) // nothing seen yet: free
	if got := l.Level(t0); got != 0 {
		t.Fatalf("level %d with none reported", got)
	}
	l.Note("a", "30", true, t0)
	l.Note("b", "70", true, t0.Add(100*time.Millisecond))
	if got := l.Level(t0.Add(200 * time.Millisecond)); got != 70 {
		t.Errorf("level %d, want the highest, 70", got)
	}
	l.Note("b", "", false, t0.Add(300*time.Millisecond)) // b recovered
	if got := l.Level(t0.Add(400 * time.Millisecond)); got != 30 {
		t.Errorf("level %d after b's answer without one, want a's 30", got)
	}
	if got := l.Level(t0.Add(chain.LevelTTL + 10*time.Millisecond)); got != 0 {
		t.Errorf("level %d after the TTL, want 0", got)
	}
	l.Note("c", "garbage", true, t0)
	for i := range 1000 { // bounded, whatever the keys
		l.Note("k"+strconv.Itoa(i), "5", true, t0)
	}
}
