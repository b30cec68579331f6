package api

import "time"

// TemplateBuildLabel marks the VM of a template build (its value is the
// template's name); a daemon that starts deletes those of builds it did
// not finish.
const TemplateBuildLabel = "agentvm.build"

// RegistryAuthHeader carries a template build's login to the registry of
// its OCI base: base64 of "username:password", as HTTP basic
// authentication writes it (not Docker's X-Registry-Auth JSON). It is used
// for that pull and not kept.
const RegistryAuthHeader = "X-Agentvm-Registry-Auth"

// HiddenDockerfile is the build-context entry a client sends a Dockerfile
// from outside the context as; COPY does not see it.
const HiddenDockerfile = ".agentvm-dockerfile"

// BuiltTemplate is a template built from a Dockerfile (POST
// /v1/templates/{name}/build): a snapshot of a machine whose start command
// already runs, which a create with "template" restores.
type BuiltTemplate struct {
	Name     string `json:"name"`
	Snapshot string `json:"snapshot"` // the snapshot a create restores
	Base     string `json:"base"`     // FROM: an image or another template
	// Steps are the Dockerfile's instructions, as written.
	Steps []string `json:"steps"`
	// Start is the start command (CMD and ENTRYPOINT); it runs as the
	// service "template-start" in every VM made from the template.
	Start []string `json:"start,omitempty"`
	// Ready is the HEALTHCHECK command the build waited on ("" for none:
	// then every EXPOSEd port accepting connections, else 2 s of running).
	Ready     string            `json:"ready,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	User      string            `json:"user,omitempty"`
	Expose    []int             `json:"expose,omitempty"`
	CPUs      int               `json:"cpus"`
	MemoryMiB int64             `json:"memory_mib"`
	DiskBytes int64             `json:"disk_bytes"`
	// StateBytes is the size of the saved memory state.
	StateBytes int64     `json:"state_bytes"`
	BuildMs    int64     `json:"build_ms"`
	CreatedAt  time.Time `json:"created_at"`
	BuiltAt    time.Time `json:"built_at"`
	// Dockerfile and BuildLog (the last build's output, its end) are in
	// GET /v1/templates/{name} only.
	Dockerfile string `json:"dockerfile,omitempty"`
	BuildLog   string `json:"build_log,omitempty"`
}

// TagTemplateRequest is POST /v1/templates/{name}/tags: the build {name}
// (NAME, or NAME:TAG) gets each tag, NAME:TAG (a tag on another build
// moves; "latest" makes it NAME's latest build).
type TagTemplateRequest struct {
	Tags []string `json:"tags"`
}

// ListTemplatesResponse is GET /v1/templates.
type ListTemplatesResponse struct {
	Templates []BuiltTemplate `json:"templates"`
}

// BuildEvent is one line of a build's stream (application/x-ndjson): a
// step's heading (Step, Of, Instruction, Cached), a line of its output
// (Log), and last either Template (built) or Error (failed).
type BuildEvent struct {
	Step        int            `json:"step,omitempty"`
	Of          int            `json:"of,omitempty"`
	Instruction string         `json:"instruction,omitempty"`
	Cached      bool           `json:"cached,omitempty"`
	Log         string         `json:"log,omitempty"`
	Error       *BuildErr      `json:"error,omitempty"`
	Template    *BuiltTemplate `json:"template,omitempty"`
}

// BuildErr is a failed build. For a failed step: its number, its line in
// the Dockerfile, its exit code (-1 when it did not exit) and its last
// output lines.
type BuildErr struct {
	Code        string `json:"code"`
	Message     string `json:"message"`
	Step        int    `json:"step,omitempty"`
	Line        int    `json:"line,omitempty"`
	Instruction string `json:"instruction,omitempty"`
	ExitCode    int    `json:"exit_code,omitempty"`
	Output      string `json:"output,omitempty"`
}

// PruneTemplatesResponse is POST /v1/templates/prune.
type PruneTemplatesResponse struct {
	Removed int `json:"removed"` // cached steps (snapshots) no template used
}
