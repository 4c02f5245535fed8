package guardhttp

import (
	"net/http"
	"slices"
)

// ExpireIdleConnsForTest makes every connection of c's transport look as
// if it were waiting for a response whose time ran out, as an early answer
// can leave one, and wakes the watchdog to close them.
func ExpireIdleConnsForTest(c *http.Client) {
	t := c.Transport.(*Transport)
	t.watch.mu.Lock()
	items := slices.Clone(t.watch.items)
	t.watch.mu.Unlock()
	for _, it := range items {
		if gc, ok := it.(*guardConn); ok {
			gc.word.Store(word(connAwaiting, 1))
		}
	}
	t.watch.wake()
}
