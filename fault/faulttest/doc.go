// Package faulttest provides real network failures for tests: a loopback
// address where nothing listens, and a TCP proxy that can be cut and
// restored, as net/http/httptest provides servers.
package faulttest
