package fleet

import (
	"context"
	"sync"
)

// MemoryBus is a Bus within one process, for tests and examples: every
// Hints subscribed to it receives what any of them publishes. Each
// subscriber has a queue of 64 hints; a hint published while a
// subscriber's queue is full is lost for that subscriber, as a real bus
// may lose it. Its zero value is ready to use; it is safe for concurrent
// use and must not be copied after first use.
type MemoryBus struct {
	mu   sync.Mutex
	subs map[*memorySub]struct{}
}

type memorySub struct {
	hints chan Hint
	quit  chan struct{}
	done  chan struct{}
}

// Publish hands h to every subscriber's queue. It never blocks and
// returns ctx's error when ctx has ended, else nil.
func (b *MemoryBus) Publish(ctx context.Context, h Hint) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		select {
		case s.hints <- h:
		default:
		}
	}
	return nil
}

// Subscribe delivers every hint published from now on to deliver, on a
// goroutine of its own, until stop is called.
func (b *MemoryBus) Subscribe(ctx context.Context, deliver func(Hint)) (stop func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &memorySub{hints: make(chan Hint, 64), quit: make(chan struct{}), done: make(chan struct{})}
	b.mu.Lock()
	if b.subs == nil {
		b.subs = make(map[*memorySub]struct{})
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.quit:
				return
			case h := <-s.hints:
				deliver(h)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			delete(b.subs, s)
			b.mu.Unlock()
			close(s.quit)
			<-s.done
		})
	}, nil
}
