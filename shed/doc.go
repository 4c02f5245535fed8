// Package shed refuses work early, by priority, when a server is overloaded.
package shed
