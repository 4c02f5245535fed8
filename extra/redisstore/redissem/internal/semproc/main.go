// Command semproc is one process of a fleet sharing a redissem semaphore,
// for the test that runs several of them: Callers goroutines call URL in
// a loop, each call under a slot of the semaphore (taken by Acquire, or by
// a guardhttp client's bulkhead), until standard input closes; then it
// prints what it did as one JSON object.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/extra/redisstore/redissem"
	"github.com/guardrail-go/guardrail/fleet"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// Report is what a process prints when it stops.
type Report struct {
	Calls         int64 `json:"calls"`
	AcquireErrors int64 `json:"acquire_errors"`
	CallErrors    int64 `json:"call_errors"`
	// The wait for a slot, in milliseconds: median, 99th percentile, most.
	WaitP50 float64 `json:"wait_p50_ms"`
	WaitP99 float64 `json:"wait_p99_ms"`
	WaitMax float64 `json:"wait_max_ms"`
}

// waits records how long each Acquire took.
type waits struct {
	mu sync.Mutex
	d  []time.Duration
}

func (w *waits) add(d time.Duration) {
	w.mu.Lock()
	w.d = append(w.d, d)
	w.mu.Unlock()
}

func (w *waits) fill(rep *Report) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.d) == 0 {
		return
	}
	slices.Sort(w.d)
	ms := func(q float64) float64 {
		return float64(w.d[min(int(q*float64(len(w.d))), len(w.d)-1)].Microseconds()) / 1000
	}
	rep.WaitP50, rep.WaitP99, rep.WaitMax = ms(0.5), ms(0.99), ms(1)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "Redis address; several, comma-separated, for a Cluster")
	prefix := flag.String("prefix", redissem.DefaultPrefix, "key prefix")
	name := flag.String("name", "api", "semaphore name")
	limit := flag.Int("limit", 50, "the fleet's limit")
	ttl := flag.Duration("ttl", time.Second, "lease TTL")
	callers := flag.Int("callers", 40, "goroutines calling at once")
	url := flag.String("url", "", "the URL each call gets")
	id := flag.String("id", "0", "this process's number, sent in X-Proc; its holder ids start with p<id>/")
	via := flag.String("via", "semaphore", "semaphore: Acquire, then an http.Client; guardhttp: a guardhttp client whose bulkhead the semaphore backs")
	flag.Parse()
	if err := run(*addr, *prefix, *name, *limit, *ttl, *callers, *url, *id, *via); err != nil {
		fmt.Fprintln(os.Stderr, "semproc:", err)
		os.Exit(1)
	}
}

func run(addr, prefix, name string, limit int, ttl time.Duration, callers int, url, id, via string) error {
	client := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: strings.Split(addr, ","), PoolSize: callers + 10})
	defer client.Close()
	if err := client.Ping(context.Background()).Err(); err != nil {
		return err
	}
	store, err := redissem.New(client, redissem.Config{Prefix: prefix})
	if err != nil {
		return err
	}
	sem, err := fleet.NewSemaphore(fleet.SemaphoreConfig{Store: store, Name: name, Limit: limit, LeaseTTL: ttl, MaxWait: -1, StoreTimeout: time.Second, ID: "p" + id})
	if err != nil {
		return err
	}
	defer sem.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
	var guarded *http.Client
	if via == "guardhttp" {
		guarded, err = guardhttp.NewClient(guardhttp.Config{
			Name:     name,
			Bulkhead: &bulkhead.Config{MaxConcurrent: callers, MaxWait: -1, Shared: sem},
		})
		if err != nil {
			return err
		}
	}

	ctx, stop := context.WithCancel(context.Background())
	var rep Report
	var w waits
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if guarded != nil {
					callGuarded(ctx, guarded, url, id, &rep)
				} else {
					call(ctx, sem, hc, url, id, &rep, &w)
				}
			}
		})
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin)) // until the test closes it
	stop()
	wg.Wait()
	w.fill(&rep)
	return json.NewEncoder(os.Stdout).Encode(&rep)
}

func call(ctx context.Context, sem *fleet.Semaphore, hc *http.Client, url, id string, rep *Report, w *waits) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	release, err := sem.Acquire(actx)
	if err == nil {
		w.add(time.Since(start))
	}
	if err != nil {
		if ctx.Err() == nil {
			atomic.AddInt64(&rep.AcquireErrors, 1)
		}
		return
	}
	defer release()
	req, _ := http.NewRequestWithContext(context.WithoutCancel(actx), http.MethodGet, url, nil)
	req.Header.Set("X-Proc", id)
	resp, err := hc.Do(req)
	if err != nil {
		atomic.AddInt64(&rep.CallErrors, 1)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	atomic.AddInt64(&rep.Calls, 1)
}

// callGuarded makes one call through the guardhttp client: its bulkhead
// takes the semaphore's slot and frees it when the body is closed.
func callGuarded(ctx context.Context, c *http.Client, url, id string, rep *Report) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(actx, http.MethodGet, url, nil)
	req.Header.Set("X-Proc", id)
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			atomic.AddInt64(&rep.CallErrors, 1)
		}
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	atomic.AddInt64(&rep.Calls, 1)
}
