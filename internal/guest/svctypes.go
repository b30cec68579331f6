package guest

import "time"

// Services, processes and detached jobs, served by the guest agent.
//
// Services are systemd units /etc/systemd/system/agentvm-<name>.service:
//
//	GET    /v1/services                    ServiceList
//	POST   /v1/services                    ServiceCreate -> 201 ServiceInfo (409 exists)
//	GET    /v1/services/{name}             ServiceInfo
//	POST   /v1/services/{name}/start|stop|restart   ServiceInfo after the action
//	DELETE /v1/services/{name}             stop, disable, remove the unit
//	GET    /v1/services/{name}/logs?lines=N&follow=1   text/plain journal lines (follow streams)
//
// Processes (from /proc):
//
//	GET  /v1/processes                     ProcessList
//	POST /v1/processes/{pid}/signal        TermSignal body ({"signal":"TERM"})
//
// Jobs are detached execs run as transient systemd units (agentvm-job-<id>)
// whose stdout and stderr go to files under /var/lib/agentvm/jobs/<id>/, so
// they outlive clients, the daemon and the agent:
//
//	POST /v1/jobs                          ExecRequest -> 201 JobInfo
//	GET  /v1/jobs                          JobList
//	GET  /v1/jobs/{id}                     JobInfo
//	GET  /v1/jobs/{id}/logs?stream=stdout|stderr|both&follow=1&offset=N   raw bytes (follow streams until exit)
//	POST /v1/jobs/{id}/wait?timeout_ms=N   JobInfo once exited (or on timeout, still running)
//	POST /v1/jobs/{id}/signal              TermSignal body
//	DELETE /v1/jobs/{id}                   kill if running, remove unit and logs
const (
	PathServices  = "/v1/services"
	PathProcesses = "/v1/processes"
	PathJobs      = "/v1/jobs"
)

// ServiceCreate is the body of POST /v1/services.
type ServiceCreate struct {
	Name  string            `json:"name"`            // [a-z0-9][a-z0-9_.-]{0,62}
	Argv  []string          `json:"argv,omitempty"`  // the command (argv[0] resolved in PATH)
	Shell string            `json:"shell,omitempty"` // or a /bin/sh -c string
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	User  string            `json:"user,omitempty"` // default root
	// Restart: no, on-failure (default), always.
	Restart string `json:"restart,omitempty"`
	// Type: simple (default, long-running) or oneshot.
	Type string `json:"type,omitempty"`
	// NoBoot: do not start it at boot (default: enabled).
	NoBoot bool `json:"no_boot,omitempty"`
	// NoStart: create without starting it now.
	NoStart bool `json:"no_start,omitempty"`
}

// ServiceInfo describes a service.
type ServiceInfo struct {
	Name        string    `json:"name"`
	Unit        string    `json:"unit"`
	Argv        []string  `json:"argv"`
	User        string    `json:"user"`
	Restart     string    `json:"restart"`
	Type        string    `json:"type"`
	Enabled     bool      `json:"enabled"`
	ActiveState string    `json:"active_state"` // active, inactive, failed, activating, ...
	SubState    string    `json:"sub_state"`    // running, dead, exited, auto-restart, ...
	MainPID     int       `json:"main_pid"`
	ExitCode    int       `json:"exit_code"` // ExecMainStatus of the last run
	Restarts    int       `json:"restarts"`  // NRestarts
	Since       time.Time `json:"since,omitempty"`
}

// ServiceList is the answer of GET /v1/services (sorted by name).
type ServiceList struct {
	Services []ServiceInfo `json:"services"`
}

// ProcessInfo is one process.
type ProcessInfo struct {
	PID        int       `json:"pid"`
	PPID       int       `json:"ppid"`
	User       string    `json:"user"`
	State      string    `json:"state"`
	Command    string    `json:"command"` // the command line (comm in brackets for kernel threads)
	CPUPercent float64   `json:"cpu_percent"`
	RSSBytes   int64     `json:"rss_bytes"`
	StartedAt  time.Time `json:"started_at"`
}

// ProcessList is the answer of GET /v1/processes (sorted by pid).
type ProcessList struct {
	Processes []ProcessInfo `json:"processes"`
}

// JobInfo describes a detached exec.
type JobInfo struct {
	ID        string     `json:"id"`
	Argv      []string   `json:"argv"`
	User      string     `json:"user"`
	PID       int        `json:"pid"`
	StartedAt time.Time  `json:"started_at"`
	Exited    bool       `json:"exited"`
	ExitCode  int        `json:"exit_code"`
	Signal    string     `json:"signal,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
}

// JobList is the answer of GET /v1/jobs (oldest first).
type JobList struct {
	Jobs []JobInfo `json:"jobs"`
}
