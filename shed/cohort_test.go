package shed_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/shed"
)

func withCohort(c int) context.Context {
	st := chain.NewState(1, 0)
	st.SetCohort(c)
	return chain.NewContext(context.Background(), st)
}

// Over each window, the share of requests at or above the admission level
// refused for capacity raises the level in proportion; requests below it
// are then refused at once for their cohort; a window without a refusal
// lowers it by one.
func TestByCohortLevel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sh, err := shed.New(shed.Config{Limit: 4, ByCohort: true})
		if err != nil {
			t.Fatal(err)
		}
		var held []shed.Token
		for range 4 {
			tok, err := sh.Acquire(withCohort(100), shed.Normal)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, tok)
		}
		// Full: refusals for capacity, for a window of 100 ms.
		for range 10 {
			if _, err := sh.Acquire(withCohort(120), shed.Normal); err == nil {
				t.Fatal("admitted past the limit")
			}
		}
		if got := sh.AdmissionLevel(); got != 0 {
			t.Fatalf("level %d within the first window, want 0", got)
		}
		time.Sleep(100 * time.Millisecond)
		_, _ = sh.Acquire(withCohort(120), shed.Normal) // ends the window
		// 11 refused of 15: up by half of (11/15 - 5%) of 128 cohorts.
		want := int(math.Ceil(0.5 * (11.0/15 - 0.05) * 128))
		if got := sh.AdmissionLevel(); got != want {
			t.Fatalf("level %d after a window of 11 refusals in 15, want %d", got, want)
		}
		// Below the level: refused for its cohort.
		_, err = sh.Acquire(withCohort(3), shed.Normal)
		level := want
		var se *shed.Error
		if !errors.As(err, &se) || se.Reason != event.ReasonCohort {
			t.Fatalf("cohort 3 below level %d: %v, want a refusal for its cohort", level, err)
		}
		// No cohort: refused for capacity only.
		if _, err := sh.Acquire(context.Background(), shed.Normal); !errors.As(err, &se) || se.Reason != event.ReasonCapacity {
			t.Errorf("no cohort: %v, want capacity", err)
		}
		for _, tok := range held {
			tok.Release()
		}
		// Windows without a refusal lower it by a tenth (at least one)
		// each.
		for i := range 2 {
			time.Sleep(100 * time.Millisecond)
			tok, err := sh.Acquire(withCohort(127), shed.Normal)
			if err != nil {
				t.Fatal(err)
			}
			tok.Release()
			want -= max(1, want/10)
			if got := sh.AdmissionLevel(); got != want {
				t.Errorf("level %d after %d quiet windows, want %d", got, i+1, want)
			}
		}
		if st := sh.Stats(); st.ShedByReason[event.ReasonCohort] != 1 {
			t.Errorf("stats: %d refused for their cohort, want 1", st.ShedByReason[event.ReasonCohort])
		}
	})
}

// Without ByCohort, a cohort changes nothing.
func TestCohortIgnoredWithoutByCohort(t *testing.T) {
	sh, _ := shed.New(shed.Config{Limit: 1})
	tok, _ := sh.Acquire(withCohort(1), shed.Normal)
	defer tok.Release()
	for range 5 {
		_, _ = sh.Acquire(withCohort(1), shed.Normal)
	}
	if got := sh.AdmissionLevel(); got != 0 {
		t.Errorf("level %d without ByCohort, want 0", got)
	}
}
