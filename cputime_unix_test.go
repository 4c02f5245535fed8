//go:build unix

package guardrail_test

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time this process has used, user and system, on all
// its threads: the benchmark's and the garbage collector's.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
