package redisbus_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/extra/redisstore/internal/redistest"
	"github.com/guardrail-go/guardrail/fleet"
)

// The fleet test's scenario. The dependency answers 503 with a
// Retry-After for pause, as a service that asks for 10 s would, shortened
// to keep the test fast: the numbers are about the pause's edges, which
// do not depend on its length.
const (
	fleetProcesses = 20
	fleetPause     = 2 * time.Second
	fleetEvery     = 50 * time.Millisecond // each process calls 20 times a second
	fleetLead      = 300 * time.Millisecond
	fleetRun       = fleetLead + fleetPause + 1200*time.Millisecond
)

// dependency is the HTTP service the fleet calls: it answers 503 with a
// Retry-After of the whole seconds left during its pause, 200 otherwise,
// and records every call it receives.
type dependency struct {
	mu         sync.Mutex
	start, end time.Time
	calls      []received
}

type received struct {
	at   time.Time
	proc string
}

func (d *dependency) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	d.mu.Lock()
	d.calls = append(d.calls, received{now, r.Header.Get("X-Process")})
	start, end := d.start, d.end
	d.mu.Unlock()
	if !start.IsZero() && !now.Before(start) && now.Before(end) {
		secs := (end.Sub(now) + time.Second - 1) / time.Second
		w.Header().Set("Retry-After", strconv.Itoa(int(secs)))
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// fleetRow is one line of the test's results.
type fleetRow struct {
	Processes        int  `json:"processes"`
	Hints            bool `json:"hints"`
	Bus              bool `json:"bus"`
	Breaker          bool `json:"breaker"`
	PauseMS          int  `json:"pause_ms"`
	CallsPerProcessS int  `json:"calls_per_process_per_s"`
	CallsDuringPause int  `json:"calls_during_pause"`
	ResumeMS         int  `json:"resume_ms"`
	Resumed          int  `json:"processes_resumed"`
	RefusedLocally   int  `json:"refused_locally"`
	HintsPublished   int  `json:"hints_published"`
}

// procCounts is what a hintproc prints when it ends.
type procCounts struct {
	Calls, OK, Paused, Failed int64
	HintStats                 fleet.HintStats `json:"hint_stats"`
}

// Twenty OS processes call one dependency that asks, with 503 and
// Retry-After, to be left alone. Without hints each process honours the
// Retry-After only in the call that was given it, and its other calls
// keep coming; with hints kept in each process, each process sends about
// one call into the pause; with hints on Redis, the first answer holds
// back the whole fleet. In every case the fleet resumes within a second
// of the pause's end. A last row, without hints but with the Policy's
// default breaker, shows what the breaker alone does: it opens after 20
// calls per process, and keeps the fleet away for 30 s, far past the
// pause (resume_ms -1: not within the run).
func TestFleetOfProcessesHonoursOnePause(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 20 processes")
	}
	addr := redistest.Addr(t)
	direct := redistest.NewClient(t, addr, redis.Options{})
	prefix := redistest.Prefix(t, direct)
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH: it builds the processes")
	}
	bin := filepath.Join(t.TempDir(), "hintproc")
	if out, err := exec.Command(gobin, "build", "-o", bin, "./internal/hintproc").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dep := new(dependency)
	srv := httptest.NewServer(dep)
	defer srv.Close()

	var rows []fleetRow
	for _, mode := range []struct{ hints, bus, breaker bool }{{false, false, false}, {true, false, false}, {true, true, false}, {false, false, true}} {
		row := runFleet(t, bin, srv.URL, addr, prefix, dep, mode.hints, mode.bus, mode.breaker)
		line, _ := json.Marshal(row)
		fmt.Println(string(line))
		t.Log(string(line))
		rows = append(rows, row)
		if mode.breaker {
			continue // measured, not a target: the breaker opens for 30 s
		}
		if row.Resumed != fleetProcesses {
			t.Errorf("hints %v, bus %v: %d of %d processes called again after the pause", mode.hints, mode.bus, row.Resumed, fleetProcesses)
		}
		if row.ResumeMS > 1000 {
			t.Errorf("hints %v, bus %v: the fleet resumed %d ms after the pause, want within 1000", mode.hints, mode.bus, row.ResumeMS)
		}
	}
	without, local, shared := rows[0], rows[1], rows[2]
	if without.CallsDuringPause < 10*fleetProcesses {
		t.Errorf("without hints: %d calls during the pause, want the fleet's traffic (about %d)", without.CallsDuringPause, fleetProcesses*int(fleetPause/fleetEvery))
	}
	if local.CallsDuringPause > 2*fleetProcesses {
		t.Errorf("hints in each process: %d calls during the pause, want about one per process (%d)", local.CallsDuringPause, fleetProcesses)
	}
	if shared.CallsDuringPause > fleetProcesses {
		t.Errorf("hints on Redis: %d calls during the pause, want at most one per process (%d)", shared.CallsDuringPause, fleetProcesses)
	}
}

// runFleet starts the processes, runs the dependency's pause while they
// call it, and measures what the dependency received.
func runFleet(t *testing.T, bin, url, addr, prefix string, dep *dependency, hints, bus, withBreaker bool) fleetRow {
	t.Helper()
	args := []string{"-url", url, "-every", fleetEvery.String(), "-run", fleetRun.String()}
	if hints {
		args = append(args, "-hints")
	}
	if withBreaker {
		args = append(args, "-breaker")
	}
	if bus {
		args = append(args, "-redis", addr, "-channel", fmt.Sprintf("%shints-%v", prefix, time.Now().UnixNano()))
	}
	type proc struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout *bufio.Reader
		stderr strings.Builder
	}
	procs := make([]*proc, fleetProcesses)
	for i := range procs {
		// Spread over the interval, as a fleet's calls are: processes that
		// called in step would all meet the pause's first instant together.
		phase := fleetEvery * time.Duration(i) / fleetProcesses
		p := &proc{cmd: exec.Command(bin, append(args, "-id", strconv.Itoa(i), "-phase", phase.String())...)}
		p.cmd.Stderr = &p.stderr
		var err error
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		out, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		p.stdout = bufio.NewReader(out)
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.cmd.Process.Kill(); p.cmd.Wait() })
		procs[i] = p
	}
	for i, p := range procs {
		if line, err := p.stdout.ReadString('\n'); err != nil || line != "ready\n" {
			p.cmd.Wait()
			t.Fatalf("process %d: %q, %v: %s", i, line, err, p.stderr.String())
		}
	}
	begin := time.Now()
	start := begin.Add(fleetLead)
	end := start.Add(fleetPause)
	dep.mu.Lock()
	dep.calls, dep.start, dep.end = nil, start, end
	dep.mu.Unlock()
	for _, p := range procs {
		io.WriteString(p.stdin, "go\n")
	}
	row := fleetRow{Processes: fleetProcesses, Hints: hints, Bus: bus, Breaker: withBreaker, PauseMS: int(fleetPause / time.Millisecond), CallsPerProcessS: int(time.Second / fleetEvery)}
	for i, p := range procs {
		line, err := p.stdout.ReadString('\n')
		if err != nil {
			p.cmd.Wait()
			t.Fatalf("process %d ended without its counts: %v: %s", i, err, p.stderr.String())
		}
		var c procCounts
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("process %d: %q: %v", i, line, err)
		}
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("process %d: %v: %s", i, err, p.stderr.String())
		}
		row.RefusedLocally += int(c.Paused)
		row.HintsPublished += int(c.HintStats.Published)
	}
	dep.mu.Lock()
	defer dep.mu.Unlock()
	resumed := make(map[string]time.Duration)
	for _, c := range dep.calls {
		switch {
		case c.at.Before(start):
		case c.at.Before(end):
			row.CallsDuringPause++
		default:
			if _, ok := resumed[c.proc]; !ok {
				resumed[c.proc] = c.at.Sub(end)
			}
		}
	}
	row.Resumed = len(resumed)
	var slowest time.Duration
	for _, d := range resumed {
		slowest = max(slowest, d)
	}
	row.ResumeMS = int(slowest / time.Millisecond)
	if len(resumed) < fleetProcesses {
		row.ResumeMS = -1 // some never resumed within the run
	}
	dep.start, dep.end = time.Time{}, time.Time{}
	return row
}
