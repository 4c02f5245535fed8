package faulttest

import "fmt"

// DeadServer is an address on loopback where nothing listens: a dial to it
// fails at once with a real "connection refused" (syscall.ECONNREFUSED), the
// way a dead dependency does. It is the server-side twin of fault.Refuse. On Linux
// the port is held by a bound socket that never listens, so no other program
// can take it while the DeadServer is open. Close is safe for concurrent use.
type DeadServer struct {
	// Addr is the host:port, e.g. "127.0.0.1:39211".
	Addr string
	// URL is "http://" + Addr.
	URL string

	close func() error
}

// NewDeadServer reserves a loopback port where nothing listens.
func NewDeadServer() (*DeadServer, error) {
	addr, closeFn, err := reserveDeadPort()
	if err != nil {
		return nil, fmt.Errorf("faulttest: reserving a dead port: %w", err)
	}
	return &DeadServer{Addr: addr, URL: "http://" + addr, close: closeFn}, nil
}

// Close releases the port.
func (d *DeadServer) Close() error { return d.close() }
