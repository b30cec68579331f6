package server

import (
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/agentvm/agentvm/api"
)

// fakeOwnedAgent is a guest agent with one service, one job and one process
// for root and for sandbox each; it records the calls that act.
type fakeOwnedAgent struct {
	mu    sync.Mutex
	acted []string
}

func (a *fakeOwnedAgent) calls() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.acted...)
}

func (a *fakeOwnedAgent) handler() http.Handler {
	services := map[string]api.ServiceInfo{"db": {Name: "db", User: "root"}, "app": {Name: "app", User: "sandbox"}}
	jobs := map[string]api.JobInfo{"j1": {ID: "j1", User: "root"}, "j2": {ID: "j2", User: "sandbox"}}
	procs := []api.ProcessInfo{{PID: 100, User: "root", Command: "postgres --password=x"}, {PID: 200, User: "sandbox", Command: "node app.js"}}
	notFound := func(w http.ResponseWriter, what string) {
		w.WriteHeader(404)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "not_found", "message": "no " + what}})
	}
	act := func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.acted = append(a.acted, r.Method+" "+r.URL.Path)
		a.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/services", func(w http.ResponseWriter, r *http.Request) {
		var l api.ServiceList
		for _, s := range services {
			l.Services = append(l.Services, s)
		}
		json.NewEncoder(w).Encode(l)
	})
	mux.HandleFunc("GET /v1/services/{name}", func(w http.ResponseWriter, r *http.Request) {
		s, ok := services[r.PathValue("name")]
		if !ok {
			notFound(w, "service")
			return
		}
		json.NewEncoder(w).Encode(s)
	})
	mux.HandleFunc("GET /v1/services/{name}/logs", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "log of "+r.PathValue("name")+"\n")
	})
	mux.HandleFunc("POST /v1/services/{name}/{action}", act)
	mux.HandleFunc("DELETE /v1/services/{name}", act)
	mux.HandleFunc("GET /v1/jobs", func(w http.ResponseWriter, r *http.Request) {
		l := api.JobList{Jobs: []api.JobInfo{jobs["j1"], jobs["j2"]}}
		json.NewEncoder(w).Encode(l)
	})
	mux.HandleFunc("GET /v1/jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		j, ok := jobs[r.PathValue("id")]
		if !ok {
			notFound(w, "job")
			return
		}
		json.NewEncoder(w).Encode(j)
	})
	mux.HandleFunc("GET /v1/jobs/{id}/logs", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "output of "+r.PathValue("id")+"\n")
	})
	mux.HandleFunc("POST /v1/jobs/{id}/{action}", act)
	mux.HandleFunc("DELETE /v1/jobs/{id}", act)
	mux.HandleFunc("GET /v1/processes", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.ProcessList{Processes: procs})
	})
	mux.HandleFunc("POST /v1/processes/{pid}/signal", act)
	return mux
}

// listed returns the names, ids or pids in a list answer.
func listed(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	var l struct {
		Services  []api.ServiceInfo `json:"services"`
		Jobs      []api.JobInfo     `json:"jobs"`
		Processes []api.ProcessInfo `json:"processes"`
	}
	if resp.StatusCode != 200 {
		t.Fatalf("list: status %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range l.Services {
		out = append(out, s.Name)
	}
	for _, j := range l.Jobs {
		out = append(out, j.ID)
	}
	for _, p := range l.Processes {
		out = append(out, p.Command)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func TestUserTokenSeesOnlyItsUser(t *testing.T) {
	agent := &fakeOwnedAgent{}
	ts := newTestServer(t, agent.handler())
	sandbox := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermExec}, User: "sandbox"}).Secret
	anyUser := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermExec}}).Secret

	for _, c := range []struct{ path, sandbox, all string }{
		{"/v1/vms/web/services", "app", "app,db"},
		{"/v1/vms/web/jobs", "j2", "j1,j2"},
		{"/v1/vms/web/processes", "node app.js", "node app.js,postgres --password=x"},
	} {
		if got := listed(t, ts.do(t, "GET", c.path, sandbox)); got != c.sandbox {
			t.Errorf("sandbox token: GET %s = %s, want %s", c.path, got, c.sandbox)
		}
		for _, secret := range []string{anyUser, testAdmin} {
			if got := listed(t, ts.do(t, "GET", c.path, secret)); got != c.all {
				t.Errorf("unrestricted: GET %s = %s, want %s", c.path, got, c.all)
			}
		}
	}

	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/v1/vms/web/services/db", 404},
		{"GET", "/v1/vms/web/services/db/logs", 404},
		{"POST", "/v1/vms/web/services/db/stop", 404},
		{"POST", "/v1/vms/web/services/db/restart", 404},
		{"DELETE", "/v1/vms/web/services/db", 404},
		{"GET", "/v1/vms/web/services/nope", 404},
		{"GET", "/v1/vms/web/jobs/j1", 404},
		{"GET", "/v1/vms/web/jobs/j1/logs", 404},
		{"POST", "/v1/vms/web/jobs/j1/signal", 404},
		{"POST", "/v1/vms/web/jobs/j1/wait", 404},
		{"DELETE", "/v1/vms/web/jobs/j1", 404},
		{"POST", "/v1/vms/web/processes/100/signal", 404},
		{"POST", "/v1/vms/web/processes/999/signal", 404},
		// its own user's
		{"GET", "/v1/vms/web/services/app", 200},
		{"GET", "/v1/vms/web/services/app/logs", 200},
		{"POST", "/v1/vms/web/services/app/stop", 204},
		{"GET", "/v1/vms/web/jobs/j2/logs", 200},
		{"POST", "/v1/vms/web/jobs/j2/signal", 204},
		{"POST", "/v1/vms/web/processes/200/signal", 204},
	} {
		resp := ts.do(t, c.method, c.path, sandbox)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("sandbox token: %s %s = %d %s, want %d", c.method, c.path, resp.StatusCode, body, c.want)
		}
		if c.want == 404 && strings.Contains(string(body), "root") {
			t.Errorf("%s %s: the 404 tells whose it is: %s", c.method, c.path, body)
		}
	}
	want := "POST /v1/services/app/stop,POST /v1/jobs/j2/signal,POST /v1/processes/200/signal"
	if got := strings.Join(agent.calls(), ","); got != want {
		t.Errorf("the agent was asked to act on: %s; want only %s", got, want)
	}

	// an unrestricted token still reaches root's
	resp := ts.do(t, "POST", "/v1/vms/web/services/db/stop", anyUser)
	resp.Body.Close()
	if resp.StatusCode != 204 {
		t.Errorf("unrestricted token: stop root service = %d", resp.StatusCode)
	}
}
