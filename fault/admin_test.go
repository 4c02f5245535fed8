package fault

import (
	"encoding/json"
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

func adminDo(t *testing.T, h http.Handler, method, target, body, remote string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
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
	admin := in.Admin(AdminConfig{})
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
		admin := in.Admin(AdminConfig{AllowRemote: tt.allow})
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
	admin := in.Admin(AdminConfig{})
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
