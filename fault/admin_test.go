package fault

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type adminState struct {
	HeaderFaults bool             `json:"header_faults"`
	Header       string           `json:"header"`
	Rules        []map[string]any `json:"rules"`
	Counters     []Counter        `json:"counters"`
}

func mustAdmin(t *testing.T, in *Injector, cfg AdminConfig) http.Handler {
	t.Helper()
	h, err := in.Admin(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// adminDo sends what curl sends to the endpoint on loopback, with the JSON
// type when there is a body.
func adminDo(t *testing.T, h http.Handler, method, target, body, remote string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Host = "127.0.0.1:8082"
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	if remote != "" {
		r.RemoteAddr = remote
	} else {
		r.RemoteAddr = "127.0.0.1:50000"
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

func decodeState(t *testing.T, body string) adminState {
	t.Helper()
	var s adminState
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	return s
}

func TestAdminChangesRulesAtRunTime(t *testing.T) {
	in := mustNew(t, Config{Rules: []Rule{{Name: "teapot", Fault: Status{Code: 418}}}})
	app := in.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	admin := mustAdmin(t, in, AdminConfig{})
	hit := func() int {
		w := httptest.NewRecorder()
		app.ServeHTTP(w, request("GET", "/"))
		return w.Code
	}
	hit()
	hit()

	code, body := adminDo(t, admin, "GET", "/rules", "", "")
	if code != 200 {
		t.Fatalf("GET /rules = %d %s", code, body)
	}
	s := decodeState(t, body)
	if len(s.Rules) != 1 || s.Rules[0]["name"] != "teapot" || s.Rules[0]["status"] != 418.0 {
		t.Errorf("rules = %+v", s.Rules)
	}
	if len(s.Counters) != 1 || s.Counters[0] != (Counter{"teapot", kindError, 2, 2}) {
		t.Errorf("counters = %+v, want teapot matched 2 fired 2", s.Counters)
	}

	// The GET answer is a config: send it back with a change, by hand this time.
	code, body = adminDo(t, admin, "PUT", "/rules", `{"rules": [
  {"name": "teapot", "kind": "error", "status": 503, "match": {"path": "/x"}},
  {"name": "slow", "kind": "latency", "delay": "1ms"}]}`, "")
	if code != 200 {
		t.Fatalf("PUT = %d %s", code, body)
	}
	if got := hit(); got != 200 {
		t.Errorf("after PUT, GET / = %d, want 200 (teapot now matches only /x)", got)
	}
	s = decodeState(t, body)
	if len(s.Rules) != 2 || s.Counters[0].Matched != 2 {
		t.Errorf("after PUT: rules %+v counters %+v; want 2 rules, teapot's counter kept", s.Rules, s.Counters)
	}
	if c := in.Counters(); c[0] != (Counter{"teapot", kindError, 2, 2}) || c[1] != (Counter{"slow", kindLatency, 1, 1}) {
		t.Errorf("counters = %+v", c)
	}

	// GET output PUT back unchanged is accepted (counters are ignored).
	_, body = adminDo(t, admin, "GET", "/", "", "")
	if code, msg := adminDo(t, admin, "POST", "/rules", body, ""); code != 200 {
		t.Errorf("PUT of GET's answer = %d %s", code, msg)
	}

	// A bad config is refused with the rule and field, and changes nothing.
	code, body = adminDo(t, admin, "PUT", "/rules", `{"rules":[{"name":"bad","kind":"error","status":99}]}`, "")
	if code != 400 || !strings.Contains(body, "rule 0 (bad): status: 99 is not an error status") {
		t.Errorf("bad PUT = %d %q", code, body)
	}
	if got := len(in.Config().Rules); got != 2 {
		t.Errorf("bad PUT changed the rules: %d rules", got)
	}

	code, body = adminDo(t, admin, "POST", "/counters/reset", "", "")
	if s := decodeState(t, body); code != 200 || s.Counters[0].Matched != 0 || s.Counters[1].Fired != 0 {
		t.Errorf("reset = %d %+v", code, s.Counters)
	}

	// Clearing every rule is a PUT of an empty config.
	if code, _ := adminDo(t, admin, "PUT", "/rules", `{"rules":[]}`, ""); code != 200 || len(in.Config().Rules) != 0 {
		t.Errorf("clear = %d, %d rules left", code, len(in.Config().Rules))
	}
}

func TestAdminRefusesRemoteClients(t *testing.T) {
	in := mustNew(t, Config{Rules: []Rule{{Name: "a", Fault: Reset{}}}})
	for _, tt := range []struct {
		remote string
		allow  bool
		want   int
	}{
		{"127.0.0.1:1234", false, 200},
		{"[::1]:1234", false, 200},
		{"127.9.9.9:1234", false, 200},
		{"203.0.113.7:1234", false, 403},
		{"[2001:db8::1]:1234", false, 403},
		{"10.0.0.1:1234", false, 403},
		{"garbage", false, 403},
		{"203.0.113.7:1234", true, 200},
	} {
		admin := mustAdmin(t, in, AdminConfig{AllowRemote: tt.allow})
		if code, _ := adminDo(t, admin, "GET", "/rules", "", tt.remote); code != tt.want {
			t.Errorf("GET from %s (allow remote %v) = %d, want %d", tt.remote, tt.allow, code, tt.want)
		}
		code, _ := adminDo(t, admin, "PUT", "/rules", `{"rules":[]}`, tt.remote)
		if code != tt.want {
			t.Errorf("PUT from %s (allow remote %v) = %d, want %d", tt.remote, tt.allow, code, tt.want)
		}
		if tt.want == 403 && len(in.Config().Rules) != 1 {
			t.Fatalf("a refused PUT from %s changed the rules", tt.remote)
		}
		_ = setRules(in, []Rule{{Name: "a", Fault: Reset{}}})
	}
}

func TestAdminMethodsAndLimits(t *testing.T) {
	in := mustNew(t, Config{})
	admin := mustAdmin(t, in, AdminConfig{})
	if code, _ := adminDo(t, admin, "DELETE", "/rules", "", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE /rules = %d, want 405", code)
	}
	if code, _ := adminDo(t, admin, "GET", "/nope", "", ""); code != http.StatusNotFound {
		t.Errorf("GET /nope = %d, want 404", code)
	}
	big := `{"rules":[` + strings.Repeat(" ", maxConfigSize) + `]}`
	if code, _ := adminDo(t, admin, "PUT", "/rules", big, ""); code != http.StatusRequestEntityTooLarge {
		t.Errorf("huge PUT = %d, want 413", code)
	}
}

// A web page open in a browser on the operator's machine is a loopback
// client: what it can make the browser send must change nothing.
func TestAdminRefusesRequestsFromWebPages(t *testing.T) {
	in := mustNew(t, Config{Rules: []Rule{{Name: "teapot", Fault: Status{Code: 418}}}})
	app := in.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	app.ServeHTTP(httptest.NewRecorder(), request("GET", "/")) // teapot: matched 1, fired 1
	srv := httptest.NewServer(mustAdmin(t, in, AdminConfig{Hosts: []string{"ops.internal"}}))
	defer srv.Close()

	send := func(method, path, host string, header map[string]string, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body == "" {
			req.Body = nil
		}
		if host != "" {
			req.Host = host
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	_, before := send("GET", "/rules", "", nil, "")

	hang := `{"rules":[{"name":"all","kind":"hang"}]}`
	for _, tt := range []struct {
		name         string
		method, path string
		host         string
		header       map[string]string
		body         string
		want         int
	}{
		{"cross-site text/plain POST", "POST", "/rules", "",
			map[string]string{"Content-Type": "text/plain", "Origin": "https://evil.example"}, hang, 415},
		{"cross-site text/plain PUT", "PUT", "/rules", "",
			map[string]string{"Content-Type": "text/plain", "Origin": "https://evil.example"}, hang, 415},
		{"no-cors text/plain without Origin", "POST", "/rules", "",
			map[string]string{"Content-Type": "text/plain;charset=UTF-8", "Sec-Fetch-Site": "cross-site"}, hang, 415},
		{"form post", "POST", "/rules", "",
			map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": "https://evil.example"}, hang, 415},
		{"body without a type", "POST", "/rules", "", nil, hang, 415},
		{"cross-origin JSON", "PUT", "/rules", "",
			map[string]string{"Content-Type": "application/json", "Origin": "https://evil.example"}, hang, 403},
		{"cross-site JSON by Sec-Fetch-Site", "POST", "/rules", "",
			map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, hang, 403},
		{"cross-site counter reset", "POST", "/counters/reset", "",
			map[string]string{"Origin": "https://evil.example"}, "", 403},
		{"no-cors counter reset with a body", "POST", "/counters/reset", "",
			map[string]string{"Content-Type": "text/plain"}, "x", 415},
		{"rebound name, GET", "GET", "/rules", "evil.example", nil, "", 403},
		{"rebound name with port, PUT", "PUT", "/rules", "evil.example:8082",
			map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example:8082"}, hang, 403},
		{"rebound name, same-origin reset", "POST", "/counters/reset", "evil.example:8082",
			map[string]string{"Origin": "http://evil.example:8082", "Sec-Fetch-Site": "same-origin"}, "", 403},
		{"name under an allowed one", "GET", "/rules", "x.ops.internal", nil, "", 403},
	} {
		code, msg := send(tt.method, tt.path, tt.host, tt.header, tt.body)
		if code != tt.want {
			t.Errorf("%s: %s %s = %d %q, want %d", tt.name, tt.method, tt.path, code, msg, tt.want)
		}
		if _, after := send("GET", "/rules", "", nil, ""); after != before {
			t.Fatalf("%s changed the admin state:\n%s\nwant\n%s", tt.name, after, before)
		}
	}
	w := httptest.NewRecorder()
	app.ServeHTTP(w, request("GET", "/"))
	if w.Code != 418 {
		t.Errorf("after the refused requests, GET / = %d, want the teapot's 418", w.Code)
	}

	// What curl and the operator's own page send still works.
	for _, tt := range []struct {
		name   string
		host   string
		header map[string]string
	}{
		{"curl", "", map[string]string{"Content-Type": "application/json"}},
		{"curl by localhost", "localhost:8082", map[string]string{"Content-Type": "application/json; charset=utf-8"}},
		{"listed host", "OPS.internal.:9999", map[string]string{"Content-Type": "application/json"}},
		{"same-origin page", "localhost:8082", map[string]string{"Content-Type": "application/json",
			"Origin": "http://localhost:8082", "Sec-Fetch-Site": "same-origin"}},
	} {
		code, body := send("PUT", "/rules", tt.host, tt.header, `{"rules":[{"name":"teapot","kind":"error","status":503}]}`)
		if s := decodeState(t, body); code != 200 || len(s.Rules) != 1 || s.Rules[0]["status"] != 503.0 {
			t.Errorf("%s: PUT = %d %s, want 200 with the new rule", tt.name, code, body)
		}
		if code, body := send("GET", "/rules", tt.host, nil, ""); code != 200 {
			t.Errorf("%s: GET = %d %s", tt.name, code, body)
		}
		_ = setRules(in, []Rule{{Name: "teapot", Fault: Status{Code: 418}}})
	}
	if code, body := send("POST", "/counters/reset", "", nil, ""); code != 200 || decodeState(t, body).Counters[0].Matched != 0 {
		t.Errorf("curl's counter reset = %d %s", code, body)
	}
}

func TestAdminHostsAreValidated(t *testing.T) {
	in := mustNew(t, Config{})
	_, err := in.Admin(AdminConfig{Hosts: []string{"ok.example", "a/b", "ok.example:8443", "x y", "h:port", ""}})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{`Hosts[1] is "a/b"`, `Hosts[3] is "x y"`, `Hosts[4] is "h:port"`, `Hosts[5] is ""`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v; want it to name %s", err, want)
		}
	}
	for _, good := range []string{"Hosts[0]", "Hosts[2]"} {
		if strings.Contains(err.Error(), good) {
			t.Errorf("err = %v names the valid %s", err, good)
		}
	}
}
