package lab

import "testing"

// The chain experiment, one short outage: the naive chain multiplies the
// bottom's calls by attempts^(tiers-1), the markers keep them near one per
// user request, and every tier's calls are counted.
func TestChain(t *testing.T) {
	for _, transport := range []string{"http", "grpc"} {
		t.Run(transport, func(t *testing.T) { testChain(t, transport) })
	}
}

func testChain(t *testing.T, transport string) {
	res := runExpTries(t, 2, "chain", "--outages", "500ms", "--tiers", "3", "--rps", "60", "--after", "1s", "--transport", transport, "--overload", "0")
	if len(res.Rows) != len(chainConfigs) {
		t.Fatalf("%d rows, want one per configuration (%d)", len(res.Rows), len(chainConfigs))
	}
	per := map[string]float64{}
	all := map[string]float64{}
	for _, r := range res.Rows {
		cfg := col(t, r, "config").(string)
		if got := col(t, r, "transport").(string); got != transport {
			t.Errorf("%s: transport %q, want %q", cfg, got, transport)
		}
		per[cfg] = col(t, r, "bottom_calls_per_request").(float64)
		all[cfg] = col(t, r, "chain_calls_per_request").(float64)
		if all[cfg] < per[cfg] {
			t.Errorf("%s: %.2f calls per request at all tiers, fewer than the bottom's %.2f", cfg, all[cfg], per[cfg])
		}
	}
	// What follows compares counts that a machine too busy to keep the
	// load's pace changes (the users' deadlines cut retries short): the
	// experiment said so by not judging its checks.
	if nj := res.NotJudged(); len(nj) > 0 {
		t.Logf("%d checks not judged (%s: %s): the counts are not compared", len(nj), nj[0].Name, nj[0].Detail)
		return
	}
	// 3 attempts through 2 retrying tiers: 9 at the bottom.
	if per[chainNaive] < 6 || per[chainNaive] > 9 {
		t.Errorf("naive: %.2f bottom calls per request, want about 9", per[chainNaive])
	}
	for _, cfg := range []string{chainBudgetMarkers, chainMarkers} {
		if per[cfg] > per[chainNaive]/4 {
			t.Errorf("%s: %.2f bottom calls per request, want far below naive's %.2f", cfg, per[cfg], per[chainNaive])
		}
	}
	if all[chainBudgetMarkers] >= all[chainBudget] {
		t.Errorf("all tiers: %.2f calls per request with markers, %.2f without: the markers must cut the upper tiers' retries", all[chainBudgetMarkers], all[chainBudget])
	}
}

// Shedding by cohort wastes far less of the backends' work than shedding
// independently, and keeps more requests whole.
func TestChainShedding(t *testing.T) {
	res := runExpTries(t, 2, "chain", "--configs", "guardrail+markers", "--outages", "500ms", "--after", "500ms", "--shed-for", "2s")
	wasted := map[string]float64{}
	good := map[string]float64{}
	for _, r := range res.Rows {
		cfg := col(t, r, "config").(string)
		if cfg == chainIndependent+" shedding" || cfg == chainConsistent+" shedding" {
			wasted[cfg] = col(t, r, "wasted_pct").(float64)
			good[cfg] = col(t, r, "goodput_pct").(float64)
		}
	}
	ind, con := chainIndependent+" shedding", chainConsistent+" shedding"
	if len(wasted) != 2 {
		t.Fatalf("shedding rows %v, want both", wasted)
	}
	if nj := res.NotJudged(); len(nj) > 0 {
		t.Logf("%d checks not judged (%s: %s): the shedding rows are not compared", len(nj), nj[0].Name, nj[0].Detail)
		return
	}
	if wasted[con] > wasted[ind]/2 {
		t.Errorf("wasted %.1f%% consistent, %.1f%% independent: want at most half", wasted[con], wasted[ind])
	}
	if good[con] <= good[ind] {
		t.Errorf("goodput %.1f%% consistent, %.1f%% independent: want more", good[con], good[ind])
	}
}
