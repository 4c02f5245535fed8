package shed_test

import (
	"context"
	"errors"
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

// Refusals for capacity raise the admission level one step each; requests
// below it are then refused at once for their cohort, and the level falls
// back while the Shedder admits with room to spare.
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
		// Full: ten refusals for capacity, of cohorts at or above the level.
		for range 10 {
			if _, err := sh.Acquire(withCohort(120), shed.Normal); err == nil {
				t.Fatal("admitted past the limit")
			}
		}
		if got := sh.AdmissionLevel(); got != 10 {
			t.Fatalf("level %d after 10 refusals, want 10", got)
		}
		// Below the level: refused for its cohort, without raising it.
		_, err = sh.Acquire(withCohort(3), shed.Normal)
		var se *shed.Error
		if !errors.As(err, &se) || se.Reason != event.ReasonCohort {
			t.Fatalf("cohort 3 below level 10: %v, want a refusal for its cohort", err)
		}
		if got := sh.AdmissionLevel(); got != 10 {
			t.Errorf("level %d after a refusal below it, want 10", got)
		}
		// No cohort: refused for capacity only, and the level stays.
		if _, err := sh.Acquire(context.Background(), shed.Normal); !errors.As(err, &se) || se.Reason != event.ReasonCapacity {
			t.Errorf("no cohort: %v, want capacity", err)
		}
		for _, tok := range held {
			tok.Release()
		}
		// Room to spare: each admission at least 50 ms apart lowers the
		// level by 8 (half the limit free).
		for i := range 2 {
			time.Sleep(60 * time.Millisecond)
			tok, err := sh.Acquire(withCohort(100), shed.Normal)
			if err != nil {
				t.Fatal(err)
			}
			tok.Release()
			if want := max(10-8*(i+1), 0); sh.AdmissionLevel() != want {
				t.Errorf("level %d after %d admissions with room, want %d", sh.AdmissionLevel(), i+1, want)
			}
		}
		st := sh.Stats()
		if st.ShedByReason[event.ReasonCohort] != 1 {
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
