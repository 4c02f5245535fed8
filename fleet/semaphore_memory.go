package fleet

import (
	"context"
	"slices"
	"sync"
	"time"
)

// MemorySemaphoreStore is a SemaphoreStore, and a SemaphoreNotifier, in
// this process's memory: for tests, and for a single process that wants a
// Semaphore's leases and fairness without a shared store. It follows the
// same rules a shared store does, on the local clock. The zero value is
// ready to use; it is safe for concurrent use.
type MemorySemaphoreStore struct {
	mu   sync.Mutex
	sems map[string]*memSem
}

type memSem struct {
	holders map[string]time.Time // lease ends
	queue   []string             // waiters in arrival order
	queued  map[string]time.Time // a waiter's place lapses then
	subs    map[*func(string)]struct{}
}

func (m *MemorySemaphoreStore) sem(name string) *memSem {
	if m.sems == nil {
		m.sems = make(map[string]*memSem)
	}
	s := m.sems[name]
	if s == nil {
		s = &memSem{holders: make(map[string]time.Time), queued: make(map[string]time.Time), subs: make(map[*func(string)]struct{})}
		m.sems[name] = s
	}
	return s
}

// promote reclaims lapsed leases and places, then hands free slots to the
// head of the queue; it returns the holders handed one.
func (s *memSem) promote(now time.Time, limit int, ttl time.Duration) []string {
	for h, end := range s.holders {
		if !end.After(now) {
			delete(s.holders, h)
		}
	}
	s.queue = slices.DeleteFunc(s.queue, func(h string) bool {
		if !s.queued[h].After(now) {
			delete(s.queued, h)
			return true
		}
		return false
	})
	var granted []string
	for len(s.holders) < limit && len(s.queue) > 0 {
		h := s.queue[0]
		s.queue = s.queue[1:]
		delete(s.queued, h)
		s.holders[h] = now.Add(ttl / 3) // the waiter's Acquire takes the full lease
		granted = append(granted, h)
	}
	return granted
}

func (m *MemorySemaphoreStore) notify(s *memSem, granted []string) {
	if len(granted) == 0 {
		return
	}
	subs := make([]func(string), 0, len(s.subs))
	for f := range s.subs {
		subs = append(subs, *f)
	}
	m.mu.Unlock()
	defer m.mu.Lock()
	for _, f := range subs {
		for _, h := range granted {
			f(h)
		}
	}
}

// Acquire implements SemaphoreStore.
func (m *MemorySemaphoreStore) Acquire(ctx context.Context, name string, limit int, holder string, ttl time.Duration) (SemaphoreState, error) {
	if err := ctx.Err(); err != nil {
		return SemaphoreState{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sem(name)
	now := time.Now()
	granted := s.promote(now, limit, ttl)
	defer m.notify(s, granted)
	if _, ok := s.holders[holder]; ok || len(s.holders) < limit {
		s.holders[holder] = now.Add(ttl)
		return SemaphoreState{Held: true, InUse: len(s.holders)}, nil
	}
	pos := slices.Index(s.queue, holder)
	if pos < 0 {
		pos = len(s.queue)
		s.queue = append(s.queue, holder)
	}
	s.queued[holder] = now.Add(ttl / 2)
	return SemaphoreState{Position: pos, InUse: len(s.holders)}, nil
}

// Renew implements SemaphoreStore.
func (m *MemorySemaphoreStore) Renew(ctx context.Context, name string, limit int, holders []string, ttl time.Duration) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sem(name)
	now := time.Now()
	granted := s.promote(now, limit, ttl)
	defer m.notify(s, granted)
	var lost []string
	for _, h := range holders {
		if _, ok := s.holders[h]; ok {
			s.holders[h] = now.Add(ttl)
		} else {
			lost = append(lost, h)
		}
	}
	return lost, nil
}

// Release implements SemaphoreStore.
func (m *MemorySemaphoreStore) Release(ctx context.Context, name string, limit int, holder string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sem(name)
	delete(s.holders, holder)
	if i := slices.Index(s.queue, holder); i >= 0 {
		s.queue = slices.Delete(s.queue, i, i+1)
		delete(s.queued, holder)
	}
	granted := s.promote(time.Now(), limit, ttl)
	m.notify(s, granted)
	return nil
}

// Notify implements SemaphoreNotifier. It calls granted on the goroutine
// whose store call handed the slot over.
func (m *MemorySemaphoreStore) Notify(ctx context.Context, name string, granted func(holder string)) (stop func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sem(name)
	key := &granted
	s.subs[key] = struct{}{}
	return func() {
		m.mu.Lock()
		delete(s.subs, key)
		m.mu.Unlock()
	}, nil
}

// InUse returns the number of slots of name held, lapsed leases excluded.
func (m *MemorySemaphoreStore) InUse(name string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, n := time.Now(), 0
	for _, end := range m.sem(name).holders {
		if end.After(now) {
			n++
		}
	}
	return n
}
