//go:build unix

package config

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLoadRefusesWhatIsNotARegularFile: Load and Reload refuse a device
// and a FIFO at once, where a FIFO used to hang them.
func TestLoadRefusesWhatIsNotARegularFile(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "policy.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("no FIFO here: %v", err)
	}
	for _, path := range []string{"/dev/zero", fifo} {
		done := make(chan error, 1)
		go func() { _, err := Load(path, Options{}); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("Load(%s): %v; want an error saying it is not a regular file", path, err)
			}
		case <-time.After(10 * time.Second): // a margin: at once, or a hang
			t.Fatalf("Load(%s) did not return", path)
		}
	}
}
