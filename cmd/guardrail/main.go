// Command guardrail runs the lab, the simulator and the fault-injection
// servers of the guardrail toolkit.
//
// Every command takes its flags before or after its arguments, answers -h
// and --help, and exits 0 when it succeeded, 1 when it failed (for the lab:
// a check contradicted what the guardrail should do) and 2 when its command
// line was wrong.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/guardrail-go/guardrail/cmd/guardrail/internal/lab"
)

// command is one subcommand. Each lives in its own file and registers itself
// in an init function, so adding one never edits this file.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("guardrail: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// Exit codes.
const (
	exitOK     = 0 // the command did what it was asked; every lab check that was judged passed
	exitFailed = 1 // the command failed, or a lab check contradicted what the guardrail should do
	exitUsage  = 2 // the command line was wrong
)

// exitCodes is the part of every help text that documents the exit codes.
const exitCodes = `Exit status: 0 ok; 1 failed (for the lab: a check contradicted what the
guardrail should do); 2 a bad command line.
`

// usageError is returned for bad command lines; main prints it with a
// one-line hint and exits 2 instead of 1.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// helpHint names the command line whose help explains a usage error, e.g.
// "guardrail lab amplification --help", when it is not the command's own.
type helpHint struct {
	err  error
	help string
}

func (h helpHint) Error() string { return h.err.Error() }
func (h helpHint) Unwrap() error { return h.err }

func main() {
	// A process the lab's fleet experiment started as one of its fleet.
	if code, ok := lab.FleetWorker(); ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(stdout)
		return exitOK
	case "help":
		// 'guardrail help lab' is 'guardrail lab --help'.
		if len(args) == 1 {
			usage(stdout)
			return exitOK
		}
		if len(args) > 2 {
			return usageFailed(stderr, "guardrail help", "help takes one command name", "guardrail --help")
		}
		args = []string{args[1], "--help"}
	case "-version", "--version":
		args = append([]string{"version"}, args[1:]...)
	}
	c, ok := commands[args[0]]
	if !ok {
		return usageFailed(stderr, "guardrail",
			fmt.Sprintf("unknown command %q (have %s)", args[0], strings.Join(commandNames(), ", ")), "guardrail --help")
	}
	err := c.run(ctx, args[1:], stdout, stderr)
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		help := "guardrail " + c.name + " --help"
		if h, ok := errors.AsType[helpHint](err); ok {
			help = h.help
		}
		return usageFailed(stderr, "guardrail "+c.name, ue.msg, help)
	default:
		fmt.Fprintf(stderr, "guardrail %s: %v\n", c.name, err)
		return exitFailed
	}
}

// usageFailed prints a usage error and the command that explains the usage,
// and returns the exit code of a bad command line.
func usageFailed(stderr io.Writer, prefix, msg, help string) int {
	fmt.Fprintf(stderr, "%s: %s\nRun '%s' for usage.\n", prefix, msg, help)
	return exitUsage
}

func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: guardrail <command> [flags] [arguments]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, n := range commandNames() {
		fmt.Fprintf(w, "  %-14s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'guardrail <command> --help' (or 'guardrail help <command>') for a")
	fmt.Fprintln(w, "command's flags; flags may come before or after its arguments.")
	fmt.Fprintln(w)
	fmt.Fprint(w, exitCodes)
}

// newFlagSet returns a flag set that reports nothing itself: parseArgs
// returns its errors and prints its help, once each.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseArgs parses args with fs, flags and operands in any order ("--" ends
// the flags), and returns the operands. On -h or --help it writes help to
// stdout and returns flag.ErrHelp; a bad flag is a usageError.
func parseArgs(fs *flag.FlagSet, args []string, stdout io.Writer, help func(w io.Writer)) ([]string, error) {
	flags, operands := splitArgs(fs, args)
	if err := fs.Parse(flags); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			help(stdout)
			return nil, err
		}
		return nil, usageError{err.Error()}
	}
	return operands, nil
}

// parseFlags is parseArgs for a command that takes no operands.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer, help func(w io.Writer)) error {
	operands, err := parseArgs(fs, args, stdout, help)
	if err != nil {
		return err
	}
	if len(operands) > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", operands[0])}
	}
	return nil
}

// splitArgs separates the flags of fs (with their values) from the operands,
// so that the flag package, which stops at the first operand, sees every
// flag. A flag that fs does not define is passed on for Parse to report.
func splitArgs(fs *flag.FlagSet, args []string) (flags, operands []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return flags, append(operands, args[i+1:]...)
		}
		if len(a) < 2 || a[0] != '-' {
			operands = append(operands, a)
			continue
		}
		flags = append(flags, a)
		if takesValue(fs, a) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return flags, operands
}

// takesValue reports whether arg ("-name" or "--name", without "=value")
// names a flag of fs that reads the next argument as its value.
func takesValue(fs *flag.FlagSet, arg string) bool {
	name := strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-")
	if strings.Contains(name, "=") {
		return false
	}
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return false
	}
	return true
}

// unknownFlag reports the name of a flag argument ("-name", "--name" or
// "--name=value") that fs does not define; -h and -help, which the flag
// package answers with help, are known.
func unknownFlag(fs *flag.FlagSet, arg string) (string, bool) {
	name := strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-")
	name, _, _ = strings.Cut(name, "=")
	if name == "" || name == "h" || name == "help" || strings.HasPrefix(name, "-") {
		return "", false // bad syntax or help: Parse reports it
	}
	return name, fs.Lookup(name) == nil
}

// flagHelp writes a help text, then fs's flags.
func flagHelp(text string, fs *flag.FlagSet) func(w io.Writer) {
	return func(w io.Writer) {
		io.WriteString(w, text)
		if hasFlags(fs) {
			printFlags(w, fs)
			fmt.Fprintln(w)
		}
		fmt.Fprint(w, exitCodes)
	}
}

// hasFlags reports whether fs defines a flag.
func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// printFlags writes fs's flag defaults to w.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	out := fs.Output()
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(out)
}
