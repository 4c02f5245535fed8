package main

import (
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
		}
	})
}
