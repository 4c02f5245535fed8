package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/cmd/guardrail/internal/sim"
)

func init() {
	register(command{
		name:    "sim",
		summary: "simulate a herd of clients retrying against a server of limited capacity (jitter strategies)",
		run:     runSim,
	})
}

const simUsage = `usage: guardrail sim [flags]

Simulates, deterministically, clients that call a server which serves at
most --capacity requests per --slot and answers 503 to the rest; refused
clients retry after their backoff strategy's delay, up to --max-attempts.
Prints one row per strategy: the calls the server received, the most
retries landing in one slot, the clients that gave up, and when the last
client finished. The defaults are a retry storm after an outage: 1000
clients failing together at t=0 against a server that serves 100 requests
per 100 ms, exponential backoff from 100 ms capped at 10 s, 10 attempts.

Strategies: none (exponential, no jitter), plus (exponential + 0..--plus-jitter),
equal, full, decorrelated.

Flags:
`

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim")
	clients := fs.Int("clients", sim.DefaultClients, "number of clients, each making one logical call")
	capacity := fs.Int("capacity", sim.DefaultCapacity, "requests the server serves per slot (0: it serves nothing)")
	slot := fs.Duration("slot", sim.DefaultSlot, "length of the server's capacity slot")
	down := fs.Duration("down", 0, "the server serves nothing before this time (an outage); 0: no outage")
	base := fs.Duration("base", 100*time.Millisecond, "backoff base delay")
	capDelay := fs.Duration("cap", 10*time.Second, "backoff cap")
	plus := fs.Duration("plus-jitter", sim.DefaultPlusJitter, "additive jitter of the plus strategy")
	attempts := fs.Int("max-attempts", sim.DefaultMaxAttempts, "attempts per client, counting the first call")
	strategies := fs.String("strategies", strings.Join(sim.Strategies(), ","), "comma-separated strategies, one row each")
	seed := fs.Uint64("seed", 1, "seed of every random draw")
	ratio := fs.Float64("budget-ratio", 0, "retry budget shared by the clients: tokens each first call deposits (0: no budget)")
	budgetMax := fs.Float64("budget-max", budget.DefaultMax, "retry budget capacity in tokens (with --budget-ratio)")
	deadline := fs.Duration("deadline", 0, "per-client deadline from its first call (0: none)")
	spread := fs.Duration("spread", 0, "spread the first calls evenly over this window (0: all at t=0)")
	rate := fs.Float64("rate", 0, "Poisson arrivals, clients per second (0: all at t=0)")
	jsonOut := fs.Bool("json", false, "write one JSON object per row instead of the table")
	if err := parseFlags(fs, args, stdout, flagHelp(simUsage, fs)); err != nil {
		return err
	}

	switch {
	case *clients < 1 || *clients > sim.ClientsLimit:
		return usageError{fmt.Sprintf("--clients must be in [1, %d]", sim.ClientsLimit)}
	case *capacity < 0:
		return usageError{"--capacity must not be negative"}
	case *slot <= 0:
		return usageError{"--slot must be positive"}
	case *down < 0:
		return usageError{"--down must not be negative"}
	case *base <= 0 || *capDelay <= 0 || *plus < 0:
		return usageError{"--base and --cap must be positive, --plus-jitter not negative"}
	case *capDelay < *base:
		return usageError{"--cap must not be below --base"}
	case *attempts < 1 || *attempts > sim.AttemptsLimit:
		return usageError{fmt.Sprintf("--max-attempts must be in [1, %d]", sim.AttemptsLimit)}
	case !(*ratio >= 0) || math.IsInf(*ratio, 0):
		return usageError{"--budget-ratio must be a non-negative number"}
	case *ratio > 0 && (!(*budgetMax >= 1) || math.IsInf(*budgetMax, 0)):
		return usageError{"--budget-max must be at least 1"}
	case *deadline < 0 || *spread < 0:
		return usageError{"--deadline and --spread must not be negative"}
	case !(*rate >= 0) || math.IsInf(*rate, 0):
		return usageError{"--rate must be a non-negative number"}
	case *spread > 0 && *rate > 0:
		return usageError{"--spread and --rate are exclusive"}
	}

	cfg := sim.JitterConfig{
		Config: sim.Config{
			Clients:     *clients,
			Slot:        *slot,
			Capacity:    *capacity,
			MaxAttempts: *attempts,
			Deadline:    *deadline,
			Arrival:     sim.Arrival{Spread: *spread, Rate: *rate},
			Seed:        *seed,
		},
		Base:       *base,
		Cap:        *capDelay,
		PlusJitter: *plus,
	}
	if *capacity == 0 || *down > 0 {
		// Config.Capacity zero means the default; a model says "nothing".
		cfg.CapacityAt = sim.Outage(*down, *capacity)
		if *capacity == 0 {
			cfg.CapacityAt = func(time.Duration) int { return 0 }
		}
	}
	if *ratio > 0 {
		cfg.Budget = &budget.Config{Ratio: *ratio, Max: *budgetMax}
	}
	for s := range strings.SplitSeq(*strategies, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Strategies = append(cfg.Strategies, s)
		}
	}
	if len(cfg.Strategies) == 0 {
		return usageError{"--strategies is empty"}
	}

	rows, err := sim.Jitter(ctx, cfg)
	if errors.Is(err, sim.ErrConfig) {
		return usageError{strings.TrimPrefix(err.Error(), "sim: ")}
	}
	if err != nil {
		return err
	}
	if *jsonOut {
		return sim.WriteJSON(stdout, rows)
	}
	return sim.WriteTable(stdout, rows)
}
