package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// The load generator runs in a process of its own, so that its goroutines
// and garbage do not share the server's scheduler: the harness re-executes
// its own binary with loadgenEnv set to a JSON loadConfig, and reads the
// records from the child's standard output.
const loadgenEnv = "ADAPTIVE_BENCH_LOADGEN"

// loadConfig tells the load generator what to send.
type loadConfig struct {
	URL      string        `json:"url"`
	RPS      float64       `json:"rps"`
	Start    int64         `json:"start_unix_ns"` // the schedule's time zero
	Duration time.Duration `json:"duration"`
	Timeout  time.Duration `json:"timeout"`
}

// record is one request, its times relative to the schedule's start.
type record struct {
	Sched  time.Duration // when it was due
	Start  time.Duration // when the client started it
	Lat    time.Duration // start to response read (or error)
	Status int64         // HTTP status; 0 for a timeout or another error
}

// completion is when the response was read, relative to the start.
func (r record) completion() time.Duration { return r.Start + r.Lat }

// loadgenMain is the child's main: it sends the load and writes records.
func loadgenMain(cfgJSON string) {
	var c loadConfig
	if err := json.Unmarshal([]byte(cfgJSON), &c); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen: bad config:", err)
		os.Exit(2)
	}
	// A request's garbage is short-lived: collecting less often leaves more
	// of the machine's two cores to keeping the schedule and to the server.
	debug.SetGCPercent(400)
	recs, dials := generate(c)
	w := bufio.NewWriterSize(os.Stdout, 1<<20)
	if err := binary.Write(w, binary.LittleEndian, dials); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
	if err := binary.Write(w, binary.LittleEndian, recs); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// generate sends c.RPS × c.Duration requests open-loop, one goroutine each,
// at their scheduled times whether or not earlier ones have been answered,
// and waits for them all. It returns the records and the number of
// connections it dialled.
func generate(c loadConfig) ([]record, int64) {
	n := int(c.RPS * c.Duration.Seconds())
	interval := float64(time.Second) / c.RPS
	var dials atomic.Int64
	d := &net.Dialer{Timeout: c.Timeout}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return d.DialContext(ctx, network, addr)
		},
		MaxIdleConns:        0, // no limit
		MaxIdleConnsPerHost: 1 << 15,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: c.Timeout}
	recs := make([]record, n)
	t0 := time.Unix(0, c.Start)
	var wg sync.WaitGroup
	fire := func(i int) {
		defer wg.Done()
		r := &recs[i]
		st := time.Now()
		r.Start = st.Sub(t0)
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, c.URL, nil)
		resp, err := client.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil {
				r.Status = int64(resp.StatusCode)
			}
		}
		r.Lat = time.Since(st)
	}
	for i := range recs {
		recs[i].Sched = time.Duration(float64(i) * interval)
	}
	time.Sleep(time.Until(t0))
	for i := 0; i < n; {
		due := min(n, int(float64(time.Since(t0))/interval)+1)
		for ; i < due; i++ {
			wg.Add(1)
			go fire(i)
		}
		if i < n {
			if d := time.Until(t0.Add(recs[i].Sched)); d > 0 {
				time.Sleep(d)
			}
		}
	}
	wg.Wait()
	return recs, dials.Load()
}

// loadResult is what the load generator process reports.
type loadResult struct {
	Recs  []record
	Dials int64         // connections it opened
	CPU   time.Duration // its user + system CPU time
}

// runLoad starts the load generator process and returns its records.
func runLoad(c loadConfig) (loadResult, error) {
	var res loadResult
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	cfg, err := json.Marshal(c)
	if err != nil {
		return res, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), loadgenEnv+"="+string(cfg))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return res, fmt.Errorf("load generator: %w", err)
	}
	res.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	size := binary.Size(record{})
	if len(out) < 8 || (len(out)-8)%size != 0 {
		return res, fmt.Errorf("load generator: %d bytes of output, not a header and whole records", len(out))
	}
	res.Dials = int64(binary.LittleEndian.Uint64(out))
	res.Recs = make([]record, (len(out)-8)/size)
	if _, err := binary.Decode(out[8:], binary.LittleEndian, res.Recs); err != nil {
		return res, fmt.Errorf("load generator: %w", err)
	}
	return res, nil
}
