// Command hintproc is one process of a fleet, for the fleet test of
// package redisbus: it calls one HTTP dependency at a steady rate, each
// call on a goroutine of its own as a server's requests are, through a
// guardrail Policy (without a breaker unless -breaker), with or without
// fleet hints, kept in the process or shared on Redis.
//
// It prints "ready" once it is subscribed, starts calling when it reads a
// line on its standard input, and after -run prints its counts as JSON
// and exits.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/extra/redisstore/redisbus"
	"github.com/guardrail-go/guardrail/fleet"
)

var errUnavailable = errors.New("503 Service Unavailable")

func main() {
	url := flag.String("url", "", "the dependency's URL")
	addr := flag.String("redis", "", "Redis address; empty: hints stay in the process")
	channel := flag.String("channel", "", "pub/sub channel")
	hints := flag.Bool("hints", false, "share pauses (Retry.Pauses)")
	id := flag.String("id", "", "this process's name, sent in X-Process")
	every := flag.Duration("every", 50*time.Millisecond, "time between calls")
	phase := flag.Duration("phase", 0, "wait before the first call, so that processes do not call in step")
	withBreaker := flag.Bool("breaker", false, "give the Policy its default breaker (else none)")
	run := flag.Duration("run", 4*time.Second, "how long to call")
	flag.Parse()
	if err := serve(*url, *addr, *channel, *hints, *withBreaker, *id, *every, *phase, *run); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// counts is what the process prints at the end.
type counts struct {
	Calls     int64           `json:"calls"`
	OK        int64           `json:"ok"`
	Paused    int64           `json:"paused"`
	Failed    int64           `json:"failed"`
	HintStats fleet.HintStats `json:"hint_stats"`
}

func serve(url, addr, channel string, withHints, withBreaker bool, id string, every, phase, run time.Duration) error {
	p := &guardrail.Policy{Name: "dep", Idempotent: true}
	if !withBreaker {
		// Without a breaker the numbers are about Retry-After alone.
		b, err := breaker.New(breaker.Config{Mode: breaker.Disabled})
		if err != nil {
			return err
		}
		p.Breaker = b
	}
	var h *fleet.Hints
	if withHints {
		cfg := fleet.HintsConfig{Dependencies: []string{"dep"}}
		if addr != "" {
			client := redis.NewClient(&redis.Options{Addr: addr})
			defer client.Close()
			bus, err := redisbus.New(redisbus.Config{Client: client, Channel: channel})
			if err != nil {
				return err
			}
			cfg.Bus = bus
		}
		var err error
		if h, err = fleet.NewHints(cfg); err != nil {
			return err
		}
		defer h.Close()
		select {
		case <-h.Subscribed():
		case <-time.After(10 * time.Second):
			return errors.New("not subscribed after 10 s")
		}
		p.Pauses = h
	}
	httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}}
	call := func(ctx context.Context) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, guardrail.Permanent(err)
		}
		req.Header.Set("X-Process", id)
		resp, err := httpc.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			if d, ok := backoff.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
				return 0, guardrail.RetryAfterError(errUnavailable, d)
			}
			return 0, guardrail.Transient(errUnavailable)
		}
		return resp.StatusCode, nil
	}

	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	var c counts
	var wg sync.WaitGroup
	end := time.After(run)
	time.Sleep(phase)
	tick := time.NewTicker(every)
	defer tick.Stop()
loop:
	for {
		select {
		case <-end:
			break loop
		case <-tick.C:
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				atomic.AddInt64(&c.Calls, 1)
				_, err := guardrail.Do(ctx, p, call)
				switch {
				case err == nil:
					atomic.AddInt64(&c.OK, 1)
				case errors.Is(err, guardrail.ErrPaused):
					atomic.AddInt64(&c.Paused, 1)
				default:
					atomic.AddInt64(&c.Failed, 1)
				}
			})
		}
	}
	wg.Wait()
	if h != nil {
		c.HintStats = h.Stats()
	}
	return json.NewEncoder(os.Stdout).Encode(c)
}
