package timeout

import (
	"net/http"
)

func callsATestServer() {
	http.Get("http://127.0.0.1:1") // files named test* are helpers for tests: not checked
	_ = &http.Client{}
}
