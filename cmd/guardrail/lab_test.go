package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestLabJSONAndExitCodes(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"lab", "--quick", "--json", "amplification", "--users", "50", "--over", "100ms"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	sc := bufio.NewScanner(&out)
	rows := 0
	for sc.Scan() {
		var obj map[string]any
		if err := json.Unmarshal(sc.Bytes(), &obj); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		if obj["experiment"] != "amplification" || obj["db_calls"] == nil || obj["per_user"] == nil {
			t.Fatalf("row lacks keys: %v", obj)
		}
		rows++
	}
	if rows != 6 {
		t.Fatalf("%d JSON rows, want 6", rows)
	}

	errb.Reset()
	if code := run(context.Background(), []string{"lab", "nosuch"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unknown experiment") {
		t.Fatalf("unknown experiment: exit %d, %q", code, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"lab", "amplification", "--help"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "-tiers") {
		t.Fatalf("lab amplification --help: exit %d, %q", code, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"lab", "amplification", "--db", "sideways"}, &out, &errb); code != 1 {
		t.Fatalf("bad --db value: exit %d, want 1", code)
	}
}
