package ratelimit

// Len returns the number of keys l tracks, at most MaxKeys.
func Len(l *Limiter) int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.keys)
		s.mu.Unlock()
	}
	return n
}

// ClientPrefix is the client the default key charges a request from the
// peer address remote to, with IPv6 grouped by prefixes of v6bits.
var ClientPrefix = clientPrefix
