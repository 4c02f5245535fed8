package timeout

import (
	"net/http"
	"testing"
)

func TestCallsATestServer(t *testing.T) {
	http.Get("http://127.0.0.1:1") // test files are not checked
	_ = &http.Client{}
}
