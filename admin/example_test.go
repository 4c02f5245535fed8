package admin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/guardrail-go/guardrail/admin"
)

// A page on another site cannot drive an operator endpoint behind a
// Guard, and neither can one whose name was rebound to its address.
func ExampleGuard() {
	guard, err := admin.New(admin.Config{Hosts: []string{"ops.internal"}})
	if err != nil {
		panic(err)
	}
	endpoint := guard.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "done")
	}))

	send := func(host, origin, ctype string) int {
		r := httptest.NewRequest("POST", "/rules", strings.NewReader(`{}`))
		r.Host = host
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		r.Header.Set("Content-Type", ctype)
		w := httptest.NewRecorder()
		endpoint.ServeHTTP(w, r)
		return w.Code
	}
	fmt.Println(send("ops.internal:9090", "", "application/json"))                     // a script
	fmt.Println(send("ops.internal:9090", "https://evil.example", "application/json")) // cross-site
	fmt.Println(send("evil.example", "", "application/json"))                          // rebound name
	fmt.Println(send("127.0.0.1:9090", "", "text/plain"))                              // no-CORS fetch
	// Output:
	// 200
	// 403
	// 403
	// 415
}
