//go:build !linux

package faulttest

import "net"

// reserveDeadPort finds a free loopback port by listening on it and closing
// the listener at once. Another program could take the port later; on Linux
// the port stays reserved instead.
func reserveDeadPort() (string, func() error, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", nil, err
	}
	return addr, func() error { return nil }, nil
}
