package fault

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseRule(t *testing.T) {
	tests := []struct {
		spec string
		want Rule
	}{
		{"reset", Rule{Probability: 1, Fault: Reset{}}},
		{" error ; status=503; retry_after=2s; probability=0.1; path=/api/**; name=flaky",
			Rule{Name: "flaky", Probability: 0.1, Match: Match{Path: "/api/**"},
				Fault: Status{Code: 503, RetryAfter: 2 * time.Second}}},
		{"latency; p50=20ms; p99=800ms; method=GET,head; header=X-Canary: 1",
			Rule{Probability: 1, Match: Match{Methods: []string{"GET", "HEAD"}, Headers: map[string]string{"X-Canary": "1"}},
				Fault: Latency{P50: 20 * time.Millisecond, P99: 800 * time.Millisecond}}},
		{"error; status=429; retry_after=5s; retry_after_date=true",
			Rule{Probability: 1, Fault: Status{Code: 429, RetryAfter: 5 * time.Second, RetryAfterDate: true}}},
		{"slow_body; bytes=1; every=1s", Rule{Probability: 1, Fault: SlowBody{Bytes: 1, Every: time.Second}}},
	}
	for _, tt := range tests {
		got, err := ParseRule(tt.spec)
		if err != nil {
			t.Errorf("%q: %v", tt.spec, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", tt.spec, got, tt.want)
		}
	}
	for _, bad := range []struct{ spec, want string }{
		{"", "kind: missing"},
		{"nope", `kind: "nope" is not a fault kind`},
		{"error; status", "status: want key=value"},
		{"error; status=x", `status: "x" is not an integer`},
		{"error; color=red", "color: unknown field"},
		{"reset; bytes=1", `bytes: does not apply to kind "reset"`},
		{"reset; probability=x", `probability: "x" is not a number`},
		{"reset; header=X", `header: "X": want Name:value`},
	} {
		_, err := ParseRule(bad.spec)
		if err == nil || !strings.Contains(err.Error(), bad.want) || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%q: err = %v, want %q", bad.spec, err, bad.want)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"rules":[{"kind":"error","status":503,"retry_after":"1s"}]}`))
	f.Add([]byte(`{"rules":[{"kind":"latency","p50":"1ms","p99":"1h","match":{"path":"/a/**"}}]}`))
	f.Add([]byte(`{"rules":[{"kind":"slow_body","bytes":9223372036854775807}]}`))
	f.Add([]byte("{\"rules\":[{\"kind\":\"reset\",\"name\":\"\xff\"}]}"))
	f.Add([]byte(`{"rules":[{"kind":"error","grpc_code":"resource_exhausted","retry_after":"1s"}]}`))
	f.Add([]byte(`{"rules":[{"kind":"error","grpc_code":"OK"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not Is ErrInvalidConfig", err)
			}
			return
		}
		// What parses is valid and survives a round trip.
		in, err := New(cfg)
		if err != nil {
			t.Fatalf("parsed config rejected by New: %v", err)
		}
		out, err := json.Marshal(in.Config())
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseConfig(out)
		if err != nil {
			t.Fatalf("round trip: %v\n%s", err, out)
		}
		if len(again.Rules) != len(cfg.Rules) {
			t.Fatalf("round trip: %d rules, want %d", len(again.Rules), len(cfg.Rules))
		}
		for i := range cfg.Rules {
			if again.Rules[i].Name != cfg.Rules[i].Name || again.Rules[i].Fault.kind() != cfg.Rules[i].Fault.kind() {
				t.Fatalf("round trip changed rule %d: %+v -> %+v", i, cfg.Rules[i], again.Rules[i])
			}
			if st, ok := cfg.Rules[i].Fault.(Status); ok && again.Rules[i].Fault.(Status).GRPCCode != st.GRPCCode {
				t.Fatalf("round trip changed rule %d: %+v -> %+v", i, cfg.Rules[i], again.Rules[i])
			}
		}
		// Deciding for a request never panics either.
		in.decide(request("GET", "/a/b"))
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // a hang or a delay ends at once
		_, _ = in.Apply(ctx, Call{Method: "POST", Path: "/a/b", Metadata: func(string) []string { return []string{"1"} }})
	})
}

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"reset", "error; status=503; retry_after=2s", "latency; p50=1ms; p99=2ms",
		"x;;=;", "latency; delay=9223372036854775807ns", "error; retry_after_raw=\x00",
		"error; grpc_code=Resource_Exhausted; retry_after=1s", "error; grpc_code=", "error; grpc_code=OK"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		r, err := ParseRule(spec)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not Is ErrInvalidConfig", err)
			}
			return
		}
		if _, err := New(Config{Rules: []Rule{r}}); err != nil {
			t.Fatalf("parsed rule rejected by New: %v", err)
		}
		if _, err := parseHeaderRule(spec); err == nil && (len(r.Match.Methods) > 0 || r.Match.Path != "") {
			t.Fatalf("header rule accepted match keys: %q", spec)
		}
	})
}

func TestParseConfigJSONOnly(t *testing.T) {
	for _, doc := range []string{"", "  \n", "null", "{}", `{"rules": null}`, `{"rules": []}`} {
		cfg, err := ParseConfig([]byte(doc))
		if err != nil || len(cfg.Rules) != 0 {
			t.Errorf("%q: %+v, %v; want an empty config", doc, cfg, err)
		}
	}
	// YAML is the command's business: the package reads JSON only.
	if _, err := ParseConfig([]byte("rules: []")); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("YAML document: err = %v, want ErrInvalidConfig", err)
	}
	if _, err := ParseConfig([]byte(strings.Repeat(`{"a":`, 20000))); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("deep JSON nesting: err = %v, want ErrInvalidConfig", err)
	}
}
