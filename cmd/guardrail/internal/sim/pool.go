package sim

import (
	"container/list"
	"context"
	"sync"
)

// Pool is a server's capacity, as the lab, the shedder's tests and the
// limiter comparison model it: a FIFO pool of slots (a database pool, a
// worker pool) whose size can change while requests hold and wait for
// slots. A request waits in arrival order;
// one whose context ends while it waits leaves the line, and one that holds
// a slot keeps it until Release, even when the pool shrinks below the
// number in use (the excess slots disappear as they are released). A Pool
// is safe for concurrent use.
type Pool struct {
	mu      sync.Mutex
	size    int
	inUse   int
	waiters list.List // of *poolWaiter, oldest first
}

type poolWaiter struct {
	ready   chan struct{} // closed when granted
	granted bool          // under pool.mu
}

// NewPool returns a pool of size slots.
func NewPool(size int) *Pool { return &Pool{size: size} }

// Acquire takes a slot, waiting in FIFO order behind earlier requests. It
// returns ctx.Err() if ctx ends first, holding nothing.
func (p *Pool) Acquire(ctx context.Context) error {
	p.mu.Lock()
	if p.inUse < p.size && p.waiters.Len() == 0 {
		p.inUse++
		p.mu.Unlock()
		return nil
	}
	w := &poolWaiter{ready: make(chan struct{})}
	e := p.waiters.PushBack(w)
	p.mu.Unlock()

	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	p.mu.Lock()
	if w.granted {
		// Granted while ctx ended: hand the slot on rather than lose it.
		p.inUse--
		p.grantLocked()
	} else {
		p.waiters.Remove(e)
	}
	p.mu.Unlock()
	return ctx.Err()
}

// Release gives back a slot taken by Acquire.
func (p *Pool) Release() {
	p.mu.Lock()
	p.inUse--
	p.grantLocked()
	p.mu.Unlock()
}

// Resize sets the number of slots. Growing admits waiters at once, oldest
// first; shrinking takes effect as slots are released.
func (p *Pool) Resize(n int) {
	p.mu.Lock()
	p.size = n
	p.grantLocked()
	p.mu.Unlock()
}

// Stats returns the slots in use and the requests waiting.
func (p *Pool) Stats() (inUse, waiting, size int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inUse, p.waiters.Len(), p.size
}

func (p *Pool) grantLocked() {
	for p.inUse < p.size && p.waiters.Len() > 0 {
		w := p.waiters.Remove(p.waiters.Front()).(*poolWaiter)
		w.granted = true
		p.inUse++
		close(w.ready)
	}
}
