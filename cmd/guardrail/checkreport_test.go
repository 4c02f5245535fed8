package main

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/guardrail-go/guardrail/extra/config"
)

// unsafeRune reports whether r may not reach a terminal raw: a control
// character (ESC, CR, BEL, NUL, ...), a bidi control or override, a line
// or paragraph separator, or another format character.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || unicode.In(r, unicode.Zl, unicode.Zp) || r == unicode.ReplacementChar
}

// checkLines fails t if a line of out holds a rune that may not reach a
// terminal raw.
func checkLines(t *testing.T, out string) {
	t.Helper()
	for i, line := range strings.Split(out, "\n") {
		if j := strings.IndexFunc(line, unsafeRune); j >= 0 {
			t.Fatalf("line %d of the report holds %q raw: %q", i+1, []rune(line[j:])[0], line)
		}
	}
}

// injectionFile is a policy file whose names and reasons carry what a
// hostile or careless author could put in them, in YAML escapes.
const injectionFile = `version: 1
dependencies:
  "pay\e[2J\e[Hments":
    kind: http
    reason: "looks fine\rNOTHING TO SEE\a\0"
    owner: "team-\u202Ekcehc"
    max_attempts: 1
  "thanh-toán":
    reason: "Gọi một lần: đủ"
    max_attempts: 1
  "bad\e]0;pwned\a":
    kind: nope
servers:
  "api\u2028x":
    reason: "srv\x1b[31m"
    deadline: {max: 2s}
`

// guardrail check escapes the control and bidi characters of names,
// reasons and diagnostics, and prints ordinary names, accented letters
// included, as they are.
func TestCheckEscapesTerminalControls(t *testing.T) {
	rep, _ := config.Parse("policy.yaml", []byte(injectionFile))
	var b strings.Builder
	if err := writeReport(&b, rep); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	checkLines(t, out)
	for _, want := range []string{
		`"pay\x1b[2J\x1b[Hments" (http)`,
		`  reason:   "looks fine\rNOTHING TO SEE\a\x00"`,
		`  owner:    "team-\u202ekcehc"`,
		"thanh-toán (http)\n",
		"  reason:   Gọi một lần: đủ\n",
		`server "api\u2028x"`,
		`  reason:   "srv\x1b[31m"`,
		`policy.yaml:12: "dependencies.bad\x1b]0;pwned\a.kind": is "nope"; want http, grpc or policy`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %s:\n%s", want, out)
		}
	}
}

func TestSafe(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"payments", "payments"},
		{"dns:///inventory:443", "dns:///inventory:443"},
		{"thanh-toán 支払い", "thanh-toán 支払い"},
		{"a\x1b[2Jb", `"a\x1b[2Jb"`},
		{"\r", `"\r"`},
		{"\x00", `"\x00"`},
		{"x\u202ey", `"x\u202ey"`},
		{"x\u2066y\u2069", `"x\u2066y\u2069"`},
		{"\xff", `"\xff"`},
		{"tab\there", `"tab\there"`},
		{"\u0085next", `"\u0085next"`},
	} {
		if got := safe(tc.in); got != tc.want {
			t.Errorf("safe(%q) = %s; want %s", tc.in, got, tc.want)
		}
	}
}

// No line guardrail check prints holds a control or bidi character,
// whatever the file says: names and reasons of a dependency and a server
// are fuzzed through YAML's escapes, and the whole file as bytes.
func FuzzCheckReportIsTerminalSafe(f *testing.F) {
	f.Add("pay\x1b[2Jments", "reason\r\a\x00", "srv\u202e", []byte(injectionFile))
	f.Add("thanh-toán", "Gọi một lần", "api", []byte("version: 1\ndependencies:\n  \"\\e\": {kind: \"\\u202e\"}\n"))
	f.Add("a\u2028b", "\xff\xfe", "\u0085", []byte("version: 1\nservers:\n  x\x1b: {}\n"))
	f.Fuzz(func(t *testing.T, name, reason, server string, raw []byte) {
		file := "version: 1\ndependencies:\n  " + strconv.QuoteToASCII(name) + ":\n    reason: " + strconv.QuoteToASCII(reason) +
			"\n    max_attempts: 1\n    owner: " + strconv.QuoteToASCII(reason+name) +
			"\nservers:\n  " + strconv.QuoteToASCII(server) + ":\n    reason: " + strconv.QuoteToASCII(reason) + "\n    deadline: {max: 2s}\n"
		for _, data := range [][]byte{[]byte(file), raw} {
			rep, _ := config.Parse("policy\x1b.yaml", data)
			var b strings.Builder
			if err := writeReport(&b, rep); err != nil {
				t.Fatal(err)
			}
			checkLines(t, b.String())
			checkJSON(t, rep)
		}
	})
}

// checkJSON fails t if the --json rendering of rep holds a rune that may
// not reach a terminal raw, or decodes to another value than
// encoding/json's own.
func checkJSON(t *testing.T, rep *config.Report) {
	t.Helper()
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	safeJS := jsonSafe(js)
	checkLines(t, string(safeJS))
	var want, got any
	if err := json.Unmarshal(js, &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(safeJS, &got); err != nil {
		t.Fatalf("the escaped JSON does not decode: %v\n%s", err, safeJS)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the escaped JSON decodes to another value:\n%s\nwant\n%s", safeJS, js)
	}
}

// guardrail check --json escapes what encoding/json leaves raw (DEL, C1
// controls, bidi overrides) as \u escapes that decode to the same text.
func TestCheckJSONEscapesTerminalControls(t *testing.T) {
	_, out, _ := runCheckOn(t, injectionFile, "--json")
	checkLines(t, out)
	for _, want := range []string{`"name": "pay\u001b[2J\u001b[Hments"`, `team-\u202ekcehc`, `"name": "thanh-toán"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the JSON report lacks %s:\n%s", want, out)
		}
	}
	rep, _ := config.Parse("policy.yaml", []byte(injectionFile))
	checkJSON(t, rep)
	if got := string(jsonSafe([]byte(`"a\u00e9` + "\U0001F600\u202e\u0085\x7f\U000E0001" + `"`))); got != `"a\u00e9😀\u202e\u0085\u007f\udb40\udc01"` {
		t.Errorf("jsonSafe = %s", got)
	}
}
