package throttle_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/throttle"
)

func TestNewRejectsEveryInvalidField(t *testing.T) {
	for _, tc := range []struct {
		cfg    throttle.Config
		fields []string
	}{
		{throttle.Config{Window: -1}, []string{"Window"}},
		{throttle.Config{K: 0.5}, []string{"K"}},
		{throttle.Config{K: math.NaN()}, []string{"K"}},
		{throttle.Config{Window: -time.Second, K: -2}, []string{"Window", "K"}},
	} {
		_, err := throttle.New(tc.cfg)
		if !errors.Is(err, throttle.ErrInvalidConfig) {
			t.Errorf("%+v: err %v; want ErrInvalidConfig", tc.cfg, err)
			continue
		}
		for _, f := range tc.fields {
			if !strings.Contains(err.Error(), "Config."+f+" ") {
				t.Errorf("%+v: err %q does not name %s", tc.cfg, err, f)
			}
		}
	}
}

// TestRejectsOnlyOnceAcceptsFallBehindK drives the throttle with explicit
// times: it admits everything while the dependency accepts, rejects about
// (requests - K·accepts)/(requests+1) once it refuses, and forgets the
// refusals after its window.
func TestRejectsOnlyOnceAcceptsFallBehindK(t *testing.T) {
	th, err := throttle.New(throttle.Config{Window: time.Minute, K: 2})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for i := range 100 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		if !th.Admit(at, 0) {
			t.Fatalf("request %d rejected by a dependency that accepted everything", i)
		}
		th.Record(at, true)
	}
	// 300 refusals: requests 400, accepts 100, p = (400-200)/401 ≈ 0.5.
	for i := range 300 {
		th.Record(t0.Add(time.Second+time.Duration(i)*time.Millisecond), false)
	}
	at := t0.Add(2 * time.Second)
	if th.Admit(at, 0.6) != true || th.Admit(at, 0.3) != false {
		t.Errorf("draws 0.6 and 0.3 at p≈0.5: want admitted and rejected")
	}
	// Two windows later nothing is remembered.
	if !th.Admit(t0.Add(3*time.Minute), 0) {
		t.Errorf("rejected after the window forgot every refusal")
	}
}

func ExampleThrottler() {
	th, _ := throttle.New(throttle.Config{}) // a 2-minute window, K = 2
	now := time.Now()
	for range 10 {
		th.Record(now, false) // the dependency refused ten requests
	}
	fmt.Println(th.Admit(now, 0.99), th.Admit(now, 0.1))
	// Output: true false
}

// The twins that take the time accept any time, also one before the
// Throttler was made: counts land in the window they fall in, and nothing
// panics.
func TestTimesBeforeCreation(t *testing.T) {
	th, err := throttle.New(throttle.Config{})
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	for range 10 {
		th.Record(past, false)
	}
	if th.Admit(past, 0.5) {
		t.Fatal("10 refusals and no accept an hour ago: want a rejection at that time")
	}
	if !th.Admit(time.Now(), 0.5) {
		t.Fatal("an hour later the refusals are out of the window: want the request admitted")
	}
}

// FuzzThrottler: any sequence of times, outcomes and draws keeps the
// rejection probability in [0, 1) and never panics.
func FuzzThrottler(f *testing.F) {
	f.Add(int64(time.Minute), []byte{0, 1, 2, 250, 255})
	f.Add(int64(1), []byte{128, 7})
	f.Add(int64(math.MaxInt64), []byte{1})
	f.Fuzz(func(t *testing.T, window int64, ops []byte) {
		th, err := throttle.New(throttle.Config{Window: time.Duration(window)})
		if err != nil {
			return
		}
		base := time.Now()
		for i, op := range ops {
			// Times spread far either side of creation, saturating.
			at := base.Add(time.Duration(int64(int8(op)) * int64(i+1) * int64(time.Hour) * 1000))
			switch op % 3 {
			case 0:
				th.Record(at, false)
			case 1:
				th.Record(at, true)
			default:
				th.Admit(at, float64(op)/256)
			}
		}
		if p := th.RejectProbability(); !(p >= 0 && p < 1) {
			t.Fatalf("RejectProbability %v", p)
		}
	})
}
