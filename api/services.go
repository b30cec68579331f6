package api

import "time"

// ServiceCreate is the body of POST /v1/vms/{id}/services: a systemd service
// in the guest (unit agentvm-<name>.service).
type ServiceCreate struct {
	Name  string            `json:"name"`
	Argv  []string          `json:"argv,omitempty"`
	Shell string            `json:"shell,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	User  string            `json:"user,omitempty"`
	// Restart: no, on-failure (default) or always.
	Restart string `json:"restart,omitempty"`
	// Type: simple (default, long-running) or oneshot.
	Type    string `json:"type,omitempty"`
	NoBoot  bool   `json:"no_boot,omitempty"`  // do not start it at boot
	NoStart bool   `json:"no_start,omitempty"` // create without starting it
}

// ServiceInfo describes a service and its state.
type ServiceInfo struct {
	Name        string    `json:"name"`
	Unit        string    `json:"unit"`
	Argv        []string  `json:"argv"`
	User        string    `json:"user"`
	Restart     string    `json:"restart"`
	Type        string    `json:"type"`
	Enabled     bool      `json:"enabled"`
	ActiveState string    `json:"active_state"`
	SubState    string    `json:"sub_state"`
	MainPID     int       `json:"main_pid"`
	ExitCode    int       `json:"exit_code"`
	Restarts    int       `json:"restarts"`
	Since       time.Time `json:"since,omitempty"`
}

// ServiceList is the body of GET /v1/vms/{id}/services.
type ServiceList struct {
	Services []ServiceInfo `json:"services"`
}

// ProcessInfo is one process inside a VM.
type ProcessInfo struct {
	PID        int       `json:"pid"`
	PPID       int       `json:"ppid"`
	User       string    `json:"user"`
	State      string    `json:"state"`
	Command    string    `json:"command"`
	CPUPercent float64   `json:"cpu_percent"`
	RSSBytes   int64     `json:"rss_bytes"`
	StartedAt  time.Time `json:"started_at"`
}

// ProcessList is the body of GET /v1/vms/{id}/processes.
type ProcessList struct {
	Processes []ProcessInfo `json:"processes"`
}

// SignalRequest names a signal: "TERM", "SIGKILL", "9"...
type SignalRequest struct {
	Signal string `json:"signal"`
}

// JobInfo is a detached exec (POST /v1/vms/{id}/jobs): its output is kept in
// the guest and it outlives clients and daemon restarts.
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

// JobList is the body of GET /v1/vms/{id}/jobs.
type JobList struct {
	Jobs []JobInfo `json:"jobs"`
}
