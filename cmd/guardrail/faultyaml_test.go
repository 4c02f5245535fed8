package main

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/fault"
)

const yamlConfig = `
# a game day
seed: 42
header_faults: true
rules:
  - name: slow-orders
    probability: 0.2
    match:
      methods: [get, POST]
      host: "orders.internal:*"
      path: /orders/**
      headers: {X-Canary: "1"}
    kind: latency
    p50: 50ms
    p99: 2s
  - name: flaky
    probability: 0.1
    kind: error
    status: 503
    retry_after: 2s
  - kind: error
    status: 429
    retry_after: 1m
    retry_after_date: true
    body: slow down
  - {kind: reset, disabled: true}
  - {kind: hang}
  - {kind: slow_body, bytes: 10, every: 100ms}
  - {kind: stall_body, bytes: 5}
  - {kind: truncate}
  - {kind: lose_response, match: {methods: [POST]}}
  - {kind: refuse}
  - {kind: latency, min: 10ms, max: 20ms}
  - {kind: error, retry_after_raw: "-1"}
`

var wantRules = []fault.Rule{
	{Name: "slow-orders", Probability: 0.2, Match: fault.Match{Methods: []string{"GET", "POST"},
		Host: "orders.internal:*", Path: "/orders/**", Headers: map[string]string{"X-Canary": "1"}},
		Fault: fault.Latency{P50: 50 * time.Millisecond, P99: 2 * time.Second}},
	{Name: "flaky", Probability: 0.1, Fault: fault.Status{Code: 503, RetryAfter: 2 * time.Second}},
	{Name: "rule-2", Probability: 1, Fault: fault.Status{Code: 429, RetryAfter: time.Minute, RetryAfterDate: true, Body: "slow down"}},
	{Name: "rule-3", Probability: 1, Disabled: true, Fault: fault.Reset{}},
	{Name: "rule-4", Probability: 1, Fault: fault.Hang{}},
	{Name: "rule-5", Probability: 1, Fault: fault.SlowBody{Bytes: 10, Every: 100 * time.Millisecond}},
	{Name: "rule-6", Probability: 1, Fault: fault.StallBody{Bytes: 5}},
	{Name: "rule-7", Probability: 1, Fault: fault.Truncate{}},
	{Name: "rule-8", Probability: 1, Match: fault.Match{Methods: []string{"POST"}}, Fault: fault.LoseResponse{}},
	{Name: "rule-9", Probability: 1, Fault: fault.Refuse{}},
	{Name: "rule-10", Probability: 1, Fault: fault.Latency{Min: 10 * time.Millisecond, Max: 20 * time.Millisecond}},
	{Name: "rule-11", Probability: 1, Fault: fault.Status{RetryAfterRaw: "-1"}},
}

func TestParseFaultConfigYAMLAndJSON(t *testing.T) {
	cfg, err := parseFaultConfig([]byte(yamlConfig))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Rules, wantRules) {
		t.Errorf("rules:\n got %+v\nwant %+v", cfg.Rules, wantRules)
	}
	if !cfg.HeaderFaults || cfg.Rand == nil {
		t.Errorf("header_faults %v, rand set %v; want true and seeded", cfg.HeaderFaults, cfg.Rand != nil)
	}
	if got, want := cfg.Rand(), fault.NewRand(42)(); got != want {
		t.Errorf("seeded Rand gives %v, want fault.NewRand(42)'s %v", got, want)
	}

	// The JSON form of the same config parses to the same rules.
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	again, err := parseFaultConfig(data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	for i := range again.Rules {
		// MarshalJSON writes the effective status and the default probability.
		if st, ok := wantRules[i].Fault.(fault.Status); ok && st.Code == 0 {
			again.Rules[i].Fault = fault.Status{RetryAfterRaw: st.RetryAfterRaw}
		}
	}
	if !reflect.DeepEqual(again.Rules, wantRules) {
		t.Errorf("JSON round trip:\n got %+v\nwant %+v\n%s", again.Rules, wantRules, data)
	}
	if !again.HeaderFaults || again.Rand != nil {
		t.Errorf("JSON has header_faults %v, rand set %v; want true and no seed", again.HeaderFaults, again.Rand != nil)
	}
}

func TestParseFaultConfigEmpty(t *testing.T) {
	for _, doc := range []string{"", "  \n", "null", "{}", "rules: []", `{"rules": null}`, "# nothing\n"} {
		cfg, err := parseFaultConfig([]byte(doc))
		if err != nil || len(cfg.Rules) != 0 {
			t.Errorf("%q: %+v, %v; want an empty config", doc, cfg, err)
		}
	}
}

func TestParseFaultConfigErrors(t *testing.T) {
	tests := []struct {
		doc  string
		want string
	}{
		{`rules: [{kind: error, status: 200}]`,
			`fault: rule 0 (rule-0): status: 200 is not an error status (want 400-599)`},
		{`{"rules":[{"kind":"reset"},{"name":"flaky","kind":"error","status":"503"}]}`,
			`fault: rule 1 (flaky): status: got a JSON string, want an integer`},
		{`rules: [{kind: reset}, {name: x, kind: error, statsu: 503}]`,
			`fault: rule 1 (x): statsu: unknown field`},
		{`rules: [{name: a, kind: latency, delay: 200}]`,
			`fault: rule 0 (a): delay: got a JSON number, want a duration such as "200ms"`},
		{`rules: [{name: a, kind: latency, delay: 2 s}]`,
			`fault: rule 0 (a): delay: "2 s" is not a duration such as "200ms"`},
		{`rules: [{name: a, kind: latency, delay: 1s, status: 500}]`,
			`fault: rule 0 (a): status: does not apply to kind "latency"`},
		{`rules: [{name: a, kind: boom}]`,
			`fault: rule 0 (a): kind: "boom" is not a fault kind`},
		{`rules: [{name: a}]`, `fault: rule 0 (a): kind: missing`},
		{`rules: [{name: a, kind: reset, probability: 0}]`, `fault: rule 0 (a): probability: 0 never fires`},
		{`rules: [{name: a, kind: reset, probability: 2}]`, `fault: rule 0 (a): probability: 2 is not between 0 and 1`},
		{`rules: [{name: a, kind: reset, match: {path: nope}}]`, `fault: rule 0 (a): match.path: "nope" does not start with '/'`},
		{`rules: [{name: a, kind: reset, match: {methds: [GET]}}]`, `fault: rule 0 (a): methds: unknown field`},
		{`rules: [{kind: reset, match: {methods: GET}}]`, `fault: rule 0: match.methods: got a JSON string, want a list`},
		{`rules: [{kind: error, status: 0}]`, `fault: rule 0: status: 0 is not an error status`},
		{`ruls: []`, `fault: invalid config: ruls: unknown field`},
		{`rules: {kind: reset}`, `fault: invalid config: rules: got a JSON object, want a list`},
		{`- kind: reset`, `fault: invalid config: document: got a JSON array, want`},
		{`rules: [`, `fault: invalid config: yaml:`},
		{`header: "X Bad"`, `fault: invalid config: header: "X Bad" is not a header name`},
		{`{1: 2}`, `fault: invalid config: key 1 is not a string`},
		{`seed: -1`, `seed: got a JSON number -1, want an integer`},
		{strings.Repeat(" ", maxFaultConfig+1), `larger than`},
	}
	for _, tt := range tests {
		_, err := parseFaultConfig([]byte(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%.60q:\n got %v\nwant %s", tt.doc, err, tt.want)
			continue
		}
		if !errors.Is(err, fault.ErrInvalidConfig) {
			t.Errorf("%.60q: %v does not Is fault.ErrInvalidConfig", tt.doc, err)
		}
	}
}

func TestParseFaultConfigHostileYAML(t *testing.T) {
	// A billion laughs: nine levels of nine aliases each.
	bomb := "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
	prev := "a"
	for i := range 9 {
		n := string(rune('b' + i))
		bomb += n + ": &" + n + " [" + strings.Repeat("*"+prev+", ", 8) + "*" + prev + "]\n"
		prev = n
	}
	for name, doc := range map[string]string{
		"alias bomb":   bomb,
		"deep flow":    strings.Repeat("[", 100000),
		"deep block":   strings.Repeat("- ", 100000),
		"self alias":   "a: &a [*a]",
		"binary":       "\x00\xff\xfe",
		"json nesting": strings.Repeat(`{"a":`, 20000),
	} {
		start := time.Now()
		_, err := parseFaultConfig([]byte(doc))
		if !errors.Is(err, fault.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want fault.ErrInvalidConfig", name, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: took %v", name, d)
		}
	}
}

func FuzzParseFaultConfig(f *testing.F) {
	f.Add([]byte(yamlConfig))
	f.Add([]byte(`{"rules":[{"kind":"error","status":503,"retry_after":"1s"}]}`))
	f.Add([]byte(`rules: [{kind: latency, p50: 1ms, p99: 1h, match: {path: "/a/**"}}]`))
	f.Add([]byte(`a: &a [*a, *a, *a]`))
	f.Add([]byte(`rules: [{kind: slow_body, bytes: 9223372036854775807}]`))
	f.Add([]byte("{\"rules\":[{\"kind\":\"reset\",\"name\":\"\xff\"}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := parseFaultConfig(data)
		if err != nil {
			if !errors.Is(err, fault.ErrInvalidConfig) {
				t.Fatalf("error %v does not Is fault.ErrInvalidConfig", err)
			}
			return
		}
		// What parses is valid and survives a round trip.
		in, err := fault.New(cfg)
		if err != nil {
			t.Fatalf("parsed config rejected by New: %v", err)
		}
		out, err := json.Marshal(in.Config())
		if err != nil {
			t.Fatal(err)
		}
		again, err := parseFaultConfig(out)
		if err != nil {
			t.Fatalf("round trip: %v\n%s", err, out)
		}
		if len(again.Rules) != len(cfg.Rules) {
			t.Fatalf("round trip: %d rules, want %d", len(again.Rules), len(cfg.Rules))
		}
		for i := range cfg.Rules {
			if again.Rules[i].Name != cfg.Rules[i].Name || reflect.TypeOf(again.Rules[i].Fault) != reflect.TypeOf(cfg.Rules[i].Fault) {
				t.Fatalf("round trip changed rule %d: %+v -> %+v", i, cfg.Rules[i], again.Rules[i])
			}
		}
	})
}
