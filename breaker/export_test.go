package breaker

// ErrTooManyProbes is the rejection of a half-open breaker whose probe
// slots are all taken.
var ErrTooManyProbes = errTooManyProbes

// GroupLen is how many breakers g holds.
func GroupLen(g *Group) int { return g.len() }
