package series

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// promName is what the OpenTelemetry Prometheus translation makes of an
// instrument: dots become underscores, unit "s" adds "_seconds" (units in
// braces are annotations and add nothing), counters end in "_total".
func promName(d *Def) string {
	n := strings.ReplaceAll(d.OTel, ".", "_")
	if d.Unit == "s" {
		n += "_seconds"
	}
	if d.Kind == Counter {
		n += "_total"
	}
	return n
}

func TestOTelNamesTranslateToPrometheusNames(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range All {
		if got := promName(d); got != d.Name {
			t.Errorf("%s translates to %s, want %s", d.OTel, got, d.Name)
		}
		if seen[d.Name] {
			t.Errorf("%s defined twice", d.Name)
		}
		seen[d.Name] = true
		if d.Kind == Histogram && d.Unit != "s" && d != Amplification {
			t.Errorf("%s: histograms here are durations in seconds, but for the amplification, a count", d.Name)
		}
		if d == ConfigReloads {
			// The process's own series: no dependency to name.
			continue
		}
		if len(d.Labels) == 0 || d.Labels[0] != LDependency {
			t.Errorf("%s: the first label must be dependency", d.Name)
		}
	}
}

func TestFolder(t *testing.T) {
	f := NewFolder(3)
	for i, tc := range []struct{ in, want string }{
		{"a", "a"}, {"b", "b"}, {"a", "a"}, {"c", "c"},
		{"d", Other}, {"a", "a"}, {Other, Other},
		{strings.Repeat("x", MaxValueLen+1), Other}, {"\xff", Other},
	} {
		if got := f.Fold(tc.in); got != tc.want {
			t.Errorf("step %d: Fold(%.20q) = %q, want %q", i, tc.in, got, tc.want)
		}
	}
	if f.Len() != 3 {
		t.Errorf("Len = %d, want 3", f.Len())
	}
	unlimited := NewFolder(-1)
	for i := range 1000 {
		if v := fmt.Sprint(i); unlimited.Fold(v) != v {
			t.Fatalf("a folder without cap folded %q", v)
		}
	}
	if NewFolder(0).max != DefaultMaxValues {
		t.Errorf("zero max is not the default")
	}
}

// TestCacheBounded: raw values folded to Other are not stored, so the
// cache holds one entry per exported combination.
func TestCacheBounded(t *testing.T) {
	fs := NewFolders(5)
	built := 0
	c := NewCache(Calls, fs, func(lv []string) string { built++; return strings.Join(lv, "|") })
	for i := range 1000 {
		got := c.Get("dep", fmt.Sprint(i), "ok", "")
		want := "dep|" + fmt.Sprint(i) + "|ok"
		if i >= 5 {
			want = "dep|other|ok"
		}
		if got != want {
			t.Fatalf("Get(%d) = %q, want %q", i, got, want)
		}
	}
	n := 0
	c.Range(func([]string, string) { n++ })
	if n != 6 || built != 6 {
		t.Errorf("%d entries, %d built; want 6 (5 operations + other)", n, built)
	}
}

func TestCacheConcurrent(t *testing.T) {
	c := NewCache(Calls, NewFolders(0), func(lv []string) *int { return new(int) })
	var wg sync.WaitGroup
	ptrs := make([]*int, 8)
	for g := range 8 {
		wg.Go(func() { ptrs[g] = c.Get("d", "o", "ok", "") })
	}
	wg.Wait()
	for _, p := range ptrs {
		if p != ptrs[0] {
			t.Fatal("concurrent Gets of one key returned different values")
		}
	}
}
