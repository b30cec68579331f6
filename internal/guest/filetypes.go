package guest

import "time"

// File endpoints served by the guest agent. Every one takes the query
// parameters path (absolute, or relative to the user's home) and user
// (default root); the operation runs with that user's file-system
// credentials, so the guest kernel enforces permissions.
const (
	PathFiles      = "/v1/files"       // GET read (offset, length), PUT atomic write (mode, mkdirs), DELETE (recursive)
	PathFilesStat  = "/v1/files/stat"  // GET FileInfo
	PathFilesList  = "/v1/files/list"  // GET FileList
	PathFilesTar   = "/v1/files/tar"   // GET tar of a file or directory tree, PUT extract a tar into a directory
	PathFilesMkdir = "/v1/files/mkdir" // POST MkdirRequest (mkdir -p)
	PathFilesMove  = "/v1/files/rename"
)

// File types in FileInfo.Type.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// FileInfo describes one file (lstat: a symlink is reported as itself).
type FileInfo struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	Mode       uint32    `json:"mode"` // permission bits incl. setuid/setgid/sticky (07777)
	UID        uint32    `json:"uid"`
	GID        uint32    `json:"gid"`
	Owner      string    `json:"owner,omitempty"`
	Group      string    `json:"group,omitempty"`
	ModTime    time.Time `json:"mtime"`
	LinkTarget string    `json:"link_target,omitempty"`
}

// FileList is the answer of GET /v1/files/list (entries sorted by name).
type FileList struct {
	Path    string     `json:"path"`
	Entries []FileInfo `json:"entries"`
}

// MkdirRequest is the body of POST /v1/files/mkdir. Missing parents are
// created; an existing directory is not an error.
type MkdirRequest struct {
	Path string `json:"path"`
	User string `json:"user,omitempty"`
	Mode uint32 `json:"mode,omitempty"` // default 0755
}

// RenameRequest is the body of POST /v1/files/rename.
type RenameRequest struct {
	From      string `json:"from"`
	To        string `json:"to"`
	User      string `json:"user,omitempty"`
	Overwrite bool   `json:"overwrite,omitempty"` // replace an existing To (never a non-empty directory)
}

// Response headers of GET /v1/files and GET /v1/files/tar.
const (
	HeaderFileMode  = "X-File-Mode"  // octal permission bits, e.g. 0644
	HeaderFileMtime = "X-File-Mtime" // RFC 3339 with nanoseconds
	HeaderFileSize  = "X-File-Size"  // full file size (GET /v1/files with a range)
	HeaderFileType  = "X-File-Type"  // GET /v1/files/tar: type of the root (file or dir)
)

// Error codes the file endpoints use in the error envelope, with their
// HTTP statuses: invalid (400), not_found (404), permission_denied (403),
// exists (409), not_empty (409), is_directory (409), not_directory (409),
// no_space (507).
const (
	CodeInvalid      = "invalid"
	CodeNotFound     = "not_found"
	CodePermission   = "permission_denied"
	CodeExists       = "exists"
	CodeNotEmpty     = "not_empty"
	CodeIsDirectory  = "is_directory"
	CodeNotDirectory = "not_directory"
	CodeNoSpace      = "no_space"
)

// PathSFTP: POST /v1/sftp?user=U with Upgrade: agentvm-sftp turns the
// stream into an SFTP session (the sftp subsystem) running as U: served
// inside the agent for root, by an `agentvm-guest sftp-server` process with
// U's credentials otherwise.
const (
	PathSFTP    = "/v1/sftp"
	SFTPUpgrade = "agentvm-sftp"
)
