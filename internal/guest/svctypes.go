package guest

// Services, processes and detached jobs, served by the guest agent.
//
// Services are systemd units /etc/systemd/system/agentvm-<name>.service:
//
//	GET    /v1/services                    api.ServiceList
//	POST   /v1/services                    api.ServiceCreate -> 201 api.ServiceInfo (409 exists)
//	GET    /v1/services/{name}             api.ServiceInfo
//	POST   /v1/services/{name}/start|stop|restart   api.ServiceInfo after the action
//	DELETE /v1/services/{name}             stop, disable, remove the unit
//	GET    /v1/services/{name}/logs?lines=N&follow=1   text/plain journal lines (follow streams)
//
// Processes (from /proc):
//
//	GET  /v1/processes                     api.ProcessList
//	POST /v1/processes/{pid}/signal        TermSignal body ({"signal":"TERM"})
//
// Jobs are detached execs run as transient systemd units (agentvm-job-<id>)
// whose stdout and stderr go to files under /var/lib/agentvm/jobs/<id>/, so
// they outlive clients, the daemon and the agent:
//
//	POST /v1/jobs                          ExecRequest -> 201 api.JobInfo
//	GET  /v1/jobs                          api.JobList
//	GET  /v1/jobs/{id}                     api.JobInfo
//	GET  /v1/jobs/{id}/logs?stream=stdout|stderr|both&follow=1&offset=N   raw bytes (follow streams until exit)
//	POST /v1/jobs/{id}/wait?timeout_ms=N   api.JobInfo once exited (or on timeout, still running)
//	POST /v1/jobs/{id}/signal              TermSignal body
//	DELETE /v1/jobs/{id}                   kill if running, remove unit and logs
const (
	PathServices  = "/v1/services"
	PathProcesses = "/v1/processes"
	PathJobs      = "/v1/jobs"
)
