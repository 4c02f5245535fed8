package admin

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestGuard(t *testing.T) {
	g, err := New(Config{Hosts: []string{"Ops.Example.com", "panel.example.net:8443"}})
	if err != nil {
		t.Fatal(err)
	}
	var served int
	h := g.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }))
	for _, tc := range []struct {
		name, method, host, ctype, body string
		header                          map[string]string
		want                            int
	}{
		{name: "loopback IP", method: "GET", host: "127.0.0.1:9090", want: 200},
		{name: "IPv6 loopback", method: "GET", host: "[::1]:9090", want: 200},
		{name: "any literal IP", method: "GET", host: "10.0.0.5:9090", want: 200},
		{name: "localhost", method: "GET", host: "localhost:9090", want: 200},
		{name: "sub.localhost", method: "GET", host: "a.localhost", want: 200},
		{name: "listed name, any port, case and dot", method: "GET", host: "OPS.example.COM.:1234", want: 200},
		{name: "listed host:port", method: "GET", host: "panel.example.net:8443", want: 200},
		{name: "listed host, other port", method: "GET", host: "panel.example.net:80", want: 403},
		{name: "rebinding name", method: "GET", host: "evil.example", want: 403},
		{name: "rebinding name on POST", method: "POST", host: "evil.example:9090", ctype: "application/json", body: "{}", want: 403},
		{name: "localhost lookalike", method: "GET", host: "localhost.evil.example", want: 403},
		{name: "empty host", method: "GET", host: "", want: 403},
		{name: "garbage host", method: "GET", host: "a b", want: 403},
		{name: "cross-site POST", method: "POST", host: "127.0.0.1:9090", ctype: "application/json", body: "{}",
			header: map[string]string{"Sec-Fetch-Site": "cross-site"}, want: 403},
		{name: "cross-origin POST by Origin", method: "POST", host: "127.0.0.1:9090", ctype: "application/json", body: "{}",
			header: map[string]string{"Origin": "https://evil.example"}, want: 403},
		{name: "same-origin POST", method: "POST", host: "127.0.0.1:9090", ctype: "application/json", body: "{}",
			header: map[string]string{"Sec-Fetch-Site": "same-origin"}, want: 200},
		{name: "cross-site GET reads", method: "GET", host: "127.0.0.1:9090",
			header: map[string]string{"Sec-Fetch-Site": "cross-site"}, want: 200},
		{name: "text/plain POST", method: "POST", host: "127.0.0.1", ctype: "text/plain", body: "{}", want: 415},
		{name: "form POST", method: "POST", host: "127.0.0.1", ctype: "application/x-www-form-urlencoded", body: "a=b", want: 415},
		{name: "body without a type", method: "PUT", host: "127.0.0.1", body: "{}", want: 415},
		{name: "JSON with charset", method: "PUT", host: "127.0.0.1", ctype: "application/json; charset=utf-8", body: "{}", want: 200},
		{name: "empty POST from curl", method: "POST", host: "127.0.0.1:9090", want: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := served
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			r := httptest.NewRequest(tc.method, "/x", body)
			r.Host = tc.host
			if tc.ctype != "" {
				r.Header.Set("Content-Type", tc.ctype)
			}
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d (%s)", w.Code, tc.want, w.Body)
			}
			if got, want := served-before, map[bool]int{true: 1, false: 0}[tc.want == 200]; got != want {
				t.Fatalf("handler ran %d times, want %d", got, want)
			}
		})
	}
}

func TestNewReportsEveryBadHost(t *testing.T) {
	_, err := New(Config{Hosts: []string{"ok.example", "", "a/b", "x:y", "fine:80", "[::1"}})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"Hosts[1]", "Hosts[2]", "Hosts[3]", "Hosts[5]"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	for _, ok := range []string{"Hosts[0]", "Hosts[4]"} {
		if strings.Contains(err.Error(), ok) {
			t.Errorf("error %q names the valid %s", err, ok)
		}
	}
}

func FuzzHostAllowed(f *testing.F) {
	for _, s := range []string{"127.0.0.1:80", "[::1]:1", "::1", "localhost", "a.localhost.", "ops.example.com:8443",
		"evil.example", "", ":", "[", "]", "[]:", "a b", "x@y", "1.2.3.4:-1", "%00", "[fe80::1%25eth0]:80"} {
		f.Add(s)
	}
	g, err := New(Config{Hosts: []string{"ops.example.com", "panel.example.net:8443"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, host string) {
		ok := g.hostAllowed(host)
		if !isASCII(host) {
			return
		}
		// Host names are case-insensitive.
		if up := strings.ToUpper(host); g.hostAllowed(up) != ok {
			t.Fatalf("hostAllowed(%q) = %v but hostAllowed(%q) = %v", host, ok, up, !ok)
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
