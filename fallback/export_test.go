package fallback

// Len returns the number of keys c holds, expired ones included until they
// are looked up or evicted.
func Len[K comparable, V any](c *Cache[K, V]) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
