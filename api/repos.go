package api

import "time"

// Repository token permissions (Token.Allow of a repository token).
const (
	RepoRead  = "read"  // clone and fetch
	RepoWrite = "write" // push (with read)
)

// CreateRepoRequest is the body of POST /v1/repos.
type CreateRepoRequest struct {
	Name string `json:"name"`
	// FromURL makes the repository a copy of the one at that http(s) URL
	// (every branch and tag), fetched by the daemon.
	FromURL string `json:"from_url,omitempty"`
	// AllowPrivate lets FromURL be on a loopback, private or link-local
	// address (refused by default).
	AllowPrivate bool `json:"allow_private,omitempty"`
}

// Repo is a hosted git repository.
type Repo struct {
	Name string `json:"name"`
	// URL is its clone URL on the API listener (/git/NAME.git).
	URL string `json:"url"`
	// Branches maps each branch to its commit; HEAD names the default.
	Branches  map[string]string `json:"branches"`
	Head      string            `json:"head,omitempty"`
	SizeBytes int64             `json:"size_bytes"`
	Hooks     []RepoHook        `json:"hooks,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
}

// ListReposResponse is the body of GET /v1/repos.
type ListReposResponse struct {
	Repos []Repo `json:"repos"`
}

// CreateRepoTokenRequest is the body of POST /v1/repos/{name}/tokens.
type CreateRepoTokenRequest struct {
	// Access is "read" (clone, fetch) or "write" (push too); default read.
	Access string `json:"access,omitempty"`
	// Branches limits pushes to the branches that match this glob
	// ("agent/*"; * matches / too); "" = any branch or tag.
	Branches string `json:"branches,omitempty"`
	// TTL is a Go duration; default 1h, at most 8760h.
	TTL  string `json:"ttl,omitempty"`
	Name string `json:"name,omitempty"`
}

// RepoHook is a webhook: a signed POST to URL after each push. Secret is
// only returned when it is added.
type RepoHook struct {
	ID     string `json:"id"`
	URL    string `json:"url"`
	Secret string `json:"secret,omitempty"`
	// AllowPrivate lets the hook reach loopback and private addresses
	// (refused by default: a hook could otherwise probe the host's network).
	AllowPrivate bool      `json:"allow_private,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
}

// AddRepoHookRequest is the body of POST /v1/repos/{name}/hooks.
type AddRepoHookRequest struct {
	URL          string `json:"url"`
	AllowPrivate bool   `json:"allow_private,omitempty"`
}

// RepoPush is a webhook's body: one push to a repository (each updated
// ref, old and new commit; a zero commit is a creation or a deletion).
type RepoPush struct {
	Repo   string      `json:"repo"`
	Pusher string      `json:"pusher"` // admin, token:<id>, vm:<id>
	VM     string      `json:"vm,omitempty"`
	Refs   []RefUpdate `json:"refs"`
	Time   time.Time   `json:"time"`
}

// RefUpdate is one ref a push changed.
type RefUpdate struct {
	Ref    string `json:"ref"`
	Before string `json:"before"`
	After  string `json:"after"`
}

// Recording describes one recording of a VM: a terminal session
// (asciicast v2) or an exec (one JSON line).
type Recording struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"` // terminal or exec
	Title      string    `json:"title"`
	User       string    `json:"user,omitempty"`
	Actor      string    `json:"actor,omitempty"`
	Start      time.Time `json:"start"`
	DurationMs int64     `json:"duration_ms"`
	Bytes      int64     `json:"bytes"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	Cut        bool      `json:"cut,omitempty"`
}

// ListRecordingsResponse is the body of GET /v1/vms/{id}/recordings.
type ListRecordingsResponse struct {
	// Enabled says whether the VM's terminals and execs are recorded.
	Enabled    bool        `json:"enabled"`
	Recordings []Recording `json:"recordings"`
}

// RecordingSettings is the body of POST /v1/vms/{id}/recordings/settings.
type RecordingSettings struct {
	Enabled bool `json:"enabled"`
}
