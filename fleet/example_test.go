package fleet_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail/fleet"
)

// A fleet of a known size: each process's share of a limit of 1,000
// requests a second when the shared store is down.
func ExampleFixed() {
	var m fleet.Members = fleet.Fixed(8)
	fmt.Println(1000 / m.Live())
	// Output: 125
}

// quota is a TokenStore of a fixed number of tokens that never refill,
// standing in for a shared store such as redisfleet's.
type quota struct {
	mu   sync.Mutex
	left int
}

func (q *quota) Take(_ context.Context, _ string, want int, _ float64, _ int) (int, time.Duration, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	got := min(want, q.left)
	q.left -= got
	if q.left == 0 {
		return got, time.Minute, nil
	}
	return got, 0, nil
}

func (q *quota) Return(_ context.Context, _ string, n int, _ float64, _ int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.left += n
	return nil
}

// Every process of the fleet would build its Limiter on the same store;
// here the store holds three tokens in all.
func ExampleLimiter() {
	l, err := fleet.NewLimiter(fleet.LimiterConfig{Store: &quota{left: 3}, Rate: 10})
	if err != nil {
		panic(err)
	}
	defer l.Close()
	for range 4 {
		fmt.Println(l.Allow(context.Background(), "tenant-1"))
	}
	// Output:
	// <nil>
	// <nil>
	// <nil>
	// fleet: rate limited; retry after 1m0s
}
