package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/guardrail-go/guardrail/extra/config"
)

func init() { register(checkCommand) }

// checkCommand is 'guardrail check'.
var checkCommand = command{name: "check", summary: "check a policy file: effective settings, differences from the defaults with their reasons, warnings", run: runCheck}

const checkUsage = `usage: guardrail check [--strict] [--json] FILE

Reads a policy file (YAML or JSON) as the config package loads it, and prints
for each dependency (kind http, grpc or policy) the settings that differ from
the defaults, with the default each replaces and the reason the file gives,
then every effective setting (hedging and adaptive throttling included,
"off" when the file turns them on nowhere), then the file's errors and warnings. Every error and warning names
the file, the line and the key.

The file is checked with the constructors that build the guardrails, so a
file that checks here loads in the service.

Flags:
`

func runCheck(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("check")
	strict := fs.Bool("strict", false, "fail on warnings too, not only on errors")
	jsonOut := fs.Bool("json", false, "write the report as one JSON object, for CI")
	operands, err := parseArgs(fs, args, stdout, flagHelp(checkUsage, fs))
	if err != nil {
		return err
	}
	if len(operands) != 1 {
		return usageError{"check takes one FILE"}
	}
	path := operands[0]
	data, err := readInputFile(path)
	if err != nil {
		return err
	}
	rep, _ := config.Parse(path, data)
	if *jsonOut {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
		if _, err := stdout.Write(jsonSafe(buf.Bytes())); err != nil {
			return err
		}
	} else if err := writeReport(stdout, rep); err != nil {
		return err
	}
	switch {
	case len(rep.Errors) > 0:
		return fmt.Errorf("%s: %d error(s)", safe(path), len(rep.Errors))
	case *strict && len(rep.Warnings) > 0:
		return fmt.Errorf("%s: %d warning(s), and --strict fails on warnings", safe(path), len(rep.Warnings))
	}
	return nil
}
