package guest

// File endpoints served by the guest agent. Every one takes the query
// parameters path (absolute, or relative to the user's home) and user
// (default root); the operation runs with that user's file-system
// credentials, so the guest kernel enforces permissions.
const (
	PathFiles      = "/v1/files"       // GET read (offset, length), PUT atomic write (mode, mkdirs), DELETE (recursive)
	PathFilesStat  = "/v1/files/stat"  // GET api.FileInfo
	PathFilesList  = "/v1/files/list"  // GET api.FileList
	PathFilesTar   = "/v1/files/tar"   // GET tar of a file or directory tree, PUT extract a tar into a directory
	PathFilesMkdir = "/v1/files/mkdir" // POST api.MkdirRequest (mkdir -p)
	PathFilesMove  = "/v1/files/rename"
)

// File types in api.FileInfo.Type.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

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
	CodeUnknownUser  = "unknown_user" // 400: the guest has no such user
	CodeTooMany      = "too_many"     // 429: a limit of the agent's is reached
	CodeConflict     = "conflict"     // 409: not in a state that allows it
)

// PathSFTP: POST /v1/sftp?user=U with Upgrade: agentvm-sftp turns the
// stream into an SFTP session (the sftp subsystem) running as U: served
// inside the agent for root, by an `agentvm-guest sftp-server` process with
// U's credentials otherwise.
const (
	PathSFTP    = "/v1/sftp"
	SFTPUpgrade = "agentvm-sftp"
)

// PathWatch: POST /v1/files/watch?path=&user=&recursive= streams the changes
// in a directory as NDJSON WatchEvents: first one of op "start" once the
// watch is in place, then one per change, with names relative to the
// watched directory; "error" ends the stream (its name says why).
const PathWatch = "/v1/files/watch"

// PathWatchSync: POST /v1/files/watch/sync?id=&mark= puts a mark in the
// event queue of the watch opened with sync=id (hex, at most 64
// characters, as is mark), behind every change it has seen so far: the
// stream reports it, in its turn, as an event of op "sync" named mark
// (WatchStream.Sync). 404 when no such watch is open (or the agent is
// older than syncs). Since protocol 1.2.
const PathWatchSync = "/v1/files/watch/sync"

// Watch operations.
const (
	WatchStart  = "start"
	WatchCreate = "create"
	WatchWrite  = "write"
	WatchRemove = "remove"
	WatchRename = "rename"
	WatchChmod  = "chmod"
	WatchError  = "error"
	WatchSync   = "sync" // a mark of PathWatchSync
)

// Limits of directory watches.
const (
	MaxWatchStreams = 64   // open watch streams per VM
	MaxWatchDirs    = 8192 // directories one recursive watch covers
)

// WatchEvent is one line of a watch stream.
type WatchEvent struct {
	Op   string `json:"op"`
	Name string `json:"name,omitempty"`
}
