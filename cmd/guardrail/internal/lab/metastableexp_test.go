package lab

import (
	"testing"
	"time"
)

// The metastable experiment, quick: without relief the service stays down
// after the DB is back, the detector sees it, and relief brings goodput
// back under the same offered load.
func TestMetastable(t *testing.T) {
	res := runExpTries(t, 2, "metastable")
	if len(res.Rows) != 2 {
		t.Fatalf("%d rows, want 2 (without and with relief)", len(res.Rows))
	}
	base, rel := res.Rows[0], res.Rows[1]
	if col(t, base, "config").(string) != "guardrail" || col(t, rel, "config").(string) != "guardrail + relief" {
		t.Fatalf("rows %q, %q", col(t, base, "config"), col(t, rel, "config"))
	}
	if on := col(t, base, "relief_ms").(time.Duration); on != 0 {
		t.Errorf("relief on for %v ms in the run without it", on)
	}
	if nj := res.NotJudged(); len(nj) > 0 {
		t.Logf("%d checks not judged (%s: %s): the timings are not compared", len(nj), nj[0].Name, nj[0].Detail)
		return
	}
	if g := col(t, base, "goodput_last_2s_pct").(float64); g >= 50 {
		t.Errorf("without relief: goodput %.1f%% at the end, want it down", g)
	}
	if g := col(t, rel, "goodput_last_2s_pct").(float64); g < 90 {
		t.Errorf("with relief: goodput %.1f%% at the end, want it back", g)
	}
	if on := col(t, rel, "relief_ms").(time.Duration); on <= 0 {
		t.Errorf("with relief: the actuator never acted")
	}
	if w0, w1 := col(t, base, "wasted_pct").(float64), col(t, rel, "wasted_pct").(float64); w1 >= w0 {
		t.Errorf("wasted DB work %.1f%% with relief, %.1f%% without: relief must cut it", w1, w0)
	}
}
