package api

// DiffDefaultIgnore are the caches a diff leaves out unless asked not to.
var DiffDefaultIgnore = []string{"/var/lib/apt/lists", "/var/cache/apt", "__pycache__", "node_modules/.cache", "/var/log/journal"}

// DiffEntry is one path that differs on a VM's disk.
type DiffEntry struct {
	Path    string `json:"path"`
	Kind    string `json:"kind"` // file, dir, symlink, other
	Size    int64  `json:"size"`
	OldSize int64  `json:"old_size,omitempty"`
	// Mode is st_mode (type and permission bits); OldMode when it changed.
	Mode    uint32 `json:"mode,omitempty"`
	OldMode uint32 `json:"old_mode,omitempty"`
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
	// What changed of a changed entry: content, mode, owner, target.
	What     []string `json:"what,omitempty"`
	Target   string   `json:"target,omitempty"`
	Binary   bool     `json:"binary,omitempty"`
	Diff     string   `json:"diff,omitempty"` // unified diff of a text file
	DiffNote string   `json:"diff_note,omitempty"`
}

// DiffResponse is the body of GET /v1/vms/{id}/diff.
type DiffResponse struct {
	VM string `json:"vm"`
	// Since is what the disk is compared with: "create" or a snapshot's
	// name; Base describes the file that point is.
	Since     string      `json:"since"`
	Base      string      `json:"base"`
	Added     []DiffEntry `json:"added"`
	Changed   []DiffEntry `json:"changed"`
	Removed   []DiffEntry `json:"removed"`
	Truncated bool        `json:"truncated,omitempty"`
	Scanned   int         `json:"scanned"`
	Ignored   []string    `json:"ignored"`
	TookMs    int64       `json:"took_ms"`
}
