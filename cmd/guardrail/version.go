package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

func init() {
	register(command{name: "version", summary: "print the module version and the revision it was built from", run: runVersion})
}

const versionUsage = `usage: guardrail version

Prints the version of the guardrail command's module, the version of the
guardrail library it was built with, the version-control revision and time
of the build's source (with "modified" when it had uncommitted changes), and
the Go version. 'guardrail --version' does the same.

`

func runVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("version")
	if err := parseFlags(fs, args, stdout, flagHelp(versionUsage, fs)); err != nil {
		return err
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		_, err := fmt.Fprintln(stdout, "guardrail: no build information in this binary")
		return err
	}
	_, err := io.WriteString(stdout, versionText(bi))
	return err
}

// libraryModule is the module of the guardrail library the command embeds.
const libraryModule = "github.com/guardrail-go/guardrail"

// versionText renders what 'guardrail version' prints from a binary's build
// information: the main module's version, the library's when it is a
// dependency of its own, the VCS revision, and the Go version.
func versionText(bi *debug.BuildInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "guardrail %s\n", orUnknown(bi.Main.Version))
	for _, d := range bi.Deps {
		if d.Path != libraryModule {
			continue
		}
		if d.Replace != nil {
			fmt.Fprintf(&b, "library %s %s => %s %s\n", d.Path, d.Version, d.Replace.Path, d.Replace.Version)
		} else {
			fmt.Fprintf(&b, "library %s %s\n", d.Path, d.Version)
		}
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "revision %s", rev)
		if t := settings["vcs.time"]; t != "" {
			fmt.Fprintf(&b, " (%s)", t)
		}
		if settings["vcs.modified"] == "true" {
			b.WriteString(" modified")
		}
		b.WriteByte('\n')
	} else {
		b.WriteString("revision unknown (built without version control information)\n")
	}
	fmt.Fprintf(&b, "built with %s\n", bi.GoVersion)
	return b.String()
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}
