//go:build unix

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInputFilesMustBeRegular: check and the fault commands refuse a
// device that never ends, a FIFO nobody writes to and a file over the
// limit, at once and with an error that says why, where they used to read
// /dev/zero until the machine ran out of memory and wait on a FIFO
// forever.
func TestInputFilesMustBeRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "policy.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("no FIFO here: %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, bytes.Repeat([]byte("#"), maxInputFile+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{"/dev/zero", "not a regular file"},
		{fifo, "not a regular file"},
		{big, "larger than"},
	} {
		done := make(chan string, 1)
		go func() {
			var stdout, stderr bytes.Buffer
			runCommand(checkCommand, []string{tc.path}, &stdout, &stderr)
			done <- stderr.String()
		}()
		select {
		case msg := <-done:
			if !strings.Contains(msg, tc.want) {
				t.Errorf("check %s: %q; want an error saying %q", tc.path, msg, tc.want)
			}
		case <-time.After(10 * time.Second): // a margin: at once, or a hang
			t.Fatalf("check %s did not return", tc.path)
		}
		// fault-server and fault-proxy read --rules through the same reader.
		if _, err := readInputFile(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rules file %s: %v; want an error saying %q", tc.path, err, tc.want)
		}
	}
}
