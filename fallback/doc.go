// Package fallback serves a degraded answer instead of an error: the last
// good value, marked stale, or a partial result without its optional parts.
package fallback
