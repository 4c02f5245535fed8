package main

import (
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail/cmd/guardrail/internal/lab"
)

// TestMain makes this test binary a worker of the lab's fleet experiment
// when a test runs the experiment, which starts its own executable as
// its processes.
func TestMain(m *testing.M) {
	if code, ok := lab.FleetWorker(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func TestSplitArgs(t *testing.T) {
	fs := newFlagSet("x")
	fs.Bool("b", false, "")
	fs.Int("n", 0, "")
	fs.String("s", "", "")
	for _, tt := range []struct {
		args            []string
		flags, operands []string
	}{
		{nil, nil, nil},
		{[]string{"a", "-b", "b"}, []string{"-b"}, []string{"a", "b"}},
		{[]string{"a", "--n", "-1", "b"}, []string{"--n", "-1"}, []string{"a", "b"}},
		{[]string{"--s", "a", "b"}, []string{"--s", "a"}, []string{"b"}},
		{[]string{"--s=a", "b", "-b=false"}, []string{"--s=a", "-b=false"}, []string{"b"}},
		{[]string{"a", "--", "-b", "--n"}, nil, []string{"a", "-b", "--n"}},
		{[]string{"-", "--bogus", "x"}, []string{"--bogus"}, []string{"-", "x"}},
		{[]string{"--n"}, []string{"--n"}, nil}, // Parse reports the missing value
	} {
		flags, operands := splitArgs(fs, tt.args)
		if !slices.Equal(flags, tt.flags) || !slices.Equal(operands, tt.operands) {
			t.Errorf("splitArgs(%q) = %q, %q; want %q, %q", tt.args, flags, operands, tt.flags, tt.operands)
		}
	}
}

// A bad command line prints one error and one line saying where the help
// is, on stderr, and exits 2.
func TestUsageErrorsPrintOneErrorAndAHint(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"sim", "--bogus"}, "guardrail sim: flag provided but not defined: -bogus\nRun 'guardrail sim --help' for usage.\n"},
		{[]string{"sim", "--clients"}, "guardrail sim: flag needs an argument: -clients\nRun 'guardrail sim --help' for usage.\n"},
		{[]string{"sim", "--clients", "x"}, "guardrail sim: invalid value \"x\" for flag -clients: parse error\nRun 'guardrail sim --help' for usage.\n"},
		{[]string{"sim", "extra"}, "guardrail sim: unexpected argument \"extra\"\nRun 'guardrail sim --help' for usage.\n"},
		{[]string{"fault-server", "--bogus"}, "guardrail fault-server: flag provided but not defined: -bogus\nRun 'guardrail fault-server --help' for usage.\n"},
		{[]string{"fault-proxy", "--bogus"}, "guardrail fault-proxy: flag provided but not defined: -bogus\nRun 'guardrail fault-proxy --help' for usage.\n"},
		{[]string{"fault-proxy"}, "guardrail fault-proxy: --to is required\nRun 'guardrail fault-proxy --help' for usage.\n"},
		{[]string{"lab", "--bogus"}, "guardrail lab: flag provided but not defined: -bogus\nRun 'guardrail lab --help' for usage.\n"},
		{[]string{"lab", "jitter", "--bogus", "1"}, "guardrail lab: jitter: flag provided but not defined: -bogus\nRun 'guardrail lab jitter --help' for usage.\n"},
		{[]string{"lab", "jitter", "--clients", "0"}, "guardrail lab: jitter: --clients, --capacity and --max-attempts must be at least 1, not 0, 100 and 10\nRun 'guardrail lab jitter --help' for usage.\n"},
		{[]string{"lab", "retry-after", "--status", "500"}, "guardrail lab: retry-after: --status must be 429 or 503\nRun 'guardrail lab retry-after --help' for usage.\n"},
		{[]string{"lab", "shedding", "--mix", "critical=1,critical=2"}, "guardrail lab: shedding: --mix: critical given twice\nRun 'guardrail lab shedding --help' for usage.\n"},
		{[]string{"lab", "idempotency", "--store", "nowhere"}, "guardrail lab: idempotency: --store must be memory, redis or postgres, not \"nowhere\"\nRun 'guardrail lab idempotency --help' for usage.\n"},
		{[]string{"lab", "overhead", "--rounds", "0"}, "guardrail lab: overhead: --rounds and --block must be positive\nRun 'guardrail lab overhead --help' for usage.\n"},
		{[]string{"version", "--bogus"}, "guardrail version: flag provided but not defined: -bogus\nRun 'guardrail version --help' for usage.\n"},
		{[]string{"version", "now"}, "guardrail version: unexpected argument \"now\"\nRun 'guardrail version --help' for usage.\n"},
		{[]string{"nosuch"}, "guardrail: unknown command \"nosuch\" (have check, fault-proxy, fault-server, lab, sim, version, vet)\nRun 'guardrail --help' for usage.\n"},
		{[]string{"help", "a", "b"}, "guardrail help: help takes one command name\nRun 'guardrail --help' for usage.\n"},
		{[]string{"help", "nosuch"}, "guardrail: unknown command \"nosuch\" (have check, fault-proxy, fault-server, lab, sim, version, vet)\nRun 'guardrail --help' for usage.\n"},
	} {
		code, out, errOut := runCmd(t, tt.args...)
		if code != 2 || out != "" || errOut != tt.want {
			t.Errorf("%q: exit %d, stdout %q, stderr\n%q\nwant exit 2, no stdout, stderr\n%q", tt.args, code, out, errOut, tt.want)
		}
	}
	// No command at all is a usage error too, with the list of commands.
	code, out, errOut := runCmd(t)
	if code != 2 || out != "" || !strings.HasPrefix(errOut, "usage: guardrail <command>") {
		t.Errorf("no arguments: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestHelpOnEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"help"}} {
		code, out, errOut := runCmd(t, args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: guardrail <command>") || !strings.Contains(out, "Exit status: 0 ok; 1 failed") {
			t.Errorf("%q: exit %d, stderr %q, stdout\n%s", args, code, errOut, out)
		}
		for _, n := range commandNames() {
			if !strings.Contains(out, "  "+n+" ") {
				t.Errorf("%q: command %s not listed:\n%s", args, n, out)
			}
		}
	}
	for _, name := range commandNames() {
		for _, args := range [][]string{{name, "-h"}, {name, "--help"}, {name, "-help"}, {"help", name}} {
			code, out, errOut := runCmd(t, args...)
			if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: guardrail "+name) ||
				!strings.Contains(out, "Exit status: 0 ok; 1 failed") || !strings.Contains(out, "2 a bad command line") {
				t.Errorf("%q: exit %d, stderr %q, stdout\n%s", args, code, errOut, out)
			}
		}
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		code, out, errOut := runCmd(t, args...)
		// A test binary has build information, without a module version
		// or revision of its own.
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "guardrail ") || !strings.Contains(out, "\nbuilt with go") {
			t.Errorf("%q: exit %d, stderr %q, stdout %q", args, code, errOut, out)
		}
	}

	bi := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/guardrail-go/guardrail/cmd/guardrail", Version: "v1.2.3"},
		Deps:      []*debug.Module{{Path: "github.com/guardrail-go/guardrail", Version: "v1.2.0"}, {Path: "golang.org/x/sys", Version: "v0.1.0"}},
		Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123456789abcdef"},
			{Key: "vcs.time", Value: "2026-12-01T19:00:00Z"}, {Key: "vcs.modified", Value: "true"}},
	}
	want := "guardrail v1.2.3\nlibrary github.com/guardrail-go/guardrail v1.2.0\nrevision 0123456789abcdef (2026-12-01T19:00:00Z) modified\nbuilt with go1.26.8\n"
	if got := versionText(bi); got != want {
		t.Errorf("versionText:\n%s\nwant\n%s", got, want)
	}
	bi.Deps[0].Replace = &debug.Module{Path: "../..", Version: "(devel)"}
	bi.Settings = bi.Settings[:3]
	want = "guardrail v1.2.3\nlibrary github.com/guardrail-go/guardrail v1.2.0 => ../.. (devel)\nrevision 0123456789abcdef (2026-12-01T19:00:00Z)\nbuilt with go1.26.8\n"
	if got := versionText(bi); got != want {
		t.Errorf("versionText, replaced and unmodified:\n%s\nwant\n%s", got, want)
	}
	bi.Settings = nil
	if got := versionText(bi); !strings.Contains(got, "revision unknown (built without version control information)\n") {
		t.Errorf("versionText without VCS information:\n%s", got)
	}
}

// splitArgs loses no argument and keeps the order of each kind: the flags
// (with their values) and the operands, with only the first "--" dropped.
func FuzzSplitArgs(f *testing.F) {
	f.Add("a\x00-b\x00--n\x00-1\x00--\x00-x")
	f.Add("--s=v\x00-\x00--bogus\x00x")
	f.Fuzz(func(t *testing.T, joined string) {
		args := strings.Split(joined, "\x00")
		fs := newFlagSet("x")
		fs.Bool("b", false, "")
		fs.Int("n", 0, "")
		fs.String("s", "", "")
		flags, operands := splitArgs(fs, args)
		n := len(flags) + len(operands)
		if n != len(args) && (n != len(args)-1 || !slices.Contains(args, "--")) {
			t.Fatalf("splitArgs(%q) = %q, %q: %d arguments, want %d (one less for a \"--\")", args, flags, operands, n, len(args))
		}
		if !subsequence(flags, args) || !subsequence(operands, args) {
			t.Fatalf("splitArgs(%q) = %q, %q: not in the order given", args, flags, operands)
		}
		if err := fs.Parse(flags); err == nil && fs.NArg() != 0 {
			t.Fatalf("splitArgs(%q): flags %q leave operands %q to Parse", args, flags, fs.Args())
		}
	})
}

// subsequence reports whether sub appears in s in order.
func subsequence(sub, s []string) bool {
	for _, x := range s {
		if len(sub) > 0 && sub[0] == x {
			sub = sub[1:]
		}
	}
	return len(sub) == 0
}
