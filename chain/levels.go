package chain

import (
	"sync"
	"sync/atomic"
	"time"
)

// LevelTTL is how long a dependency's admission level counts after the
// answer that reported it: a dependency that stopped answering, or whose
// callers stopped calling it, stops refusing requests at their doors.
const LevelTTL = time.Second

// maxLevelKeys bounds the dependencies a Levels keeps: past it, a new key
// replaces the stalest.
const maxLevelKeys = 256

// Levels keeps the admission levels a client's dependencies reported on
// their answers (HeaderAdmission), by key (a host, a target), and answers
// the highest that is still fresh, for Config.Admission. The client
// transports (guardhttp, guardgrpc) each keep one. The zero Levels is
// ready to use; it is safe for concurrent use.
type Levels struct {
	seen atomic.Bool  // a level above 0 was reported once
	cur  atomic.Int32 // the highest fresh level at the last update
	exp  atomic.Int64 // when cur stops counting, in unix nanoseconds

	mu    sync.Mutex
	byKey map[string]levelAt
}

type levelAt struct {
	level int
	until int64 // unix nanoseconds
}

// Note records what an answer from key said at now: the value of its
// HeaderAdmission, or present false when it carried none (level 0). It
// costs nothing until some dependency reported a level above 0.
func (l *Levels) Note(key, v string, present bool, now time.Time) {
	level := 0
	if present {
		if n, ok := ParseAdmission(v); ok {
			level = n
		}
	}
	if level == 0 && !l.seen.Load() {
		return
	}
	ns := now.UnixNano()
	cur := int(l.cur.Load())
	if level == 0 && cur == 0 {
		return // nothing above 0 is in force, and this adds none
	}
	if level == cur && ns < l.exp.Load()-int64(LevelTTL/2) {
		// Every answer of a shedding dependency says its level: while
		// the one in force is the same and fresh, there is nothing to
		// update, and no lock to take.
		return
	}
	l.seen.Store(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byKey == nil {
		l.byKey = make(map[string]levelAt)
	}
	if _, ok := l.byKey[key]; !ok && len(l.byKey) >= maxLevelKeys {
		l.evictLocked()
	}
	l.byKey[key] = levelAt{level, ns + int64(LevelTTL)}
	top, until := 0, int64(0)
	for k, e := range l.byKey {
		switch {
		case e.until <= ns:
			delete(l.byKey, k)
		case e.level > top:
			top, until = e.level, e.until
		case e.level == top && e.until > until:
			until = e.until
		}
	}
	l.cur.Store(int32(top))
	l.exp.Store(until)
}

// Seen reports whether a dependency ever reported a level above 0: until
// then Note costs nothing, and need not be given the time.
func (l *Levels) Seen() bool { return l.seen.Load() }

// evictLocked drops the entry that expires first. The caller holds l.mu.
func (l *Levels) evictLocked() {
	var oldest string
	first := true
	var at int64
	for k, e := range l.byKey {
		if first || e.until < at {
			oldest, at, first = k, e.until, false
		}
	}
	delete(l.byKey, oldest)
}

// Level returns the highest admission level a dependency reported that is
// still fresh at now, 0 if none.
func (l *Levels) Level(now time.Time) int {
	c := l.cur.Load()
	if c == 0 || now.UnixNano() >= l.exp.Load() {
		return 0
	}
	return int(c)
}
