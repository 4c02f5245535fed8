package faulttest

import (
	"net"
	"strconv"
	"sync"
	"syscall"
)

// reserveDeadPort binds a TCP socket to a free loopback port and never calls
// listen on it: the kernel answers connections with a reset, which the
// client sees as ECONNREFUSED, and the port stays ours until closed.
func reserveDeadPort() (string, func() error, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return "", nil, err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return "", nil, err
	}
	port := sa.(*syscall.SockaddrInet4).Port
	var once sync.Once
	var cerr error
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), func() error {
		once.Do(func() { cerr = syscall.Close(fd) })
		return cerr
	}, nil
}
