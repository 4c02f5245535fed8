// Package testsupport is a test helper: it imports testing, so it is not
// production code and is not checked.
package testsupport

import (
	"net"
	"net/http"
	"testing"
)

func Dial(t *testing.T, addr string) net.Conn {
	c, _ := net.Dial("tcp", addr)
	http.Get("http://" + addr)
	return c
}
