package e2b

// The JSON forms of envd's messages (package process and package
// filesystem), as the protobuf JSON mapping spells them: lowerCamelCase
// names, bytes in base64, enums by name, oneofs as one present field.
// Written here from the published SDKs' behaviour.

// process.*

type ptySize struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}

type pty struct {
	Size *ptySize `json:"size,omitempty"`
}

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type processSelector struct {
	PID *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type processInfo struct {
	Config processConfig `json:"config"`
	PID    uint32        `json:"pid"`
	Tag    *string       `json:"tag,omitempty"`
}

type startRequest struct {
	Process *processConfig `json:"process"`
	PTY     *pty           `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	Stdin   *bool          `json:"stdin,omitempty"`
}

type connectRequest struct {
	Process *processSelector `json:"process"`
}

type listResponse struct {
	Processes []processInfo `json:"processes"`
}

type processInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	PTY   []byte `json:"pty,omitempty"`
}

type sendInputRequest struct {
	Process *processSelector `json:"process"`
	Input   *processInput    `json:"input"`
}

type closeStdinRequest struct {
	Process *processSelector `json:"process"`
}

type updateRequest struct {
	Process *processSelector `json:"process"`
	PTY     *pty             `json:"pty,omitempty"`
}

type empty struct{}

type startEvent struct {
	PID uint32 `json:"pid"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int32  `json:"exitCode"`
	Exited   bool   `json:"exited"`
	Status   string `json:"status"`
	Error    string `json:"error,omitempty"`
}

type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *empty      `json:"keepalive,omitempty"`
}

// processEventResponse is StartResponse and ConnectResponse.
type processEventResponse struct {
	Event processEvent `json:"event"`
}

// filesystem.*

const (
	fileTypeFile      = "FILE_TYPE_FILE"
	fileTypeDirectory = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink   = "FILE_TYPE_SYMLINK"
	fileTypeOther     = "FILE_TYPE_UNSPECIFIED"
)

type entryInfo struct {
	Name          string            `json:"name"`
	Type          string            `json:"type"`
	Path          string            `json:"path"`
	Size          string            `json:"size"` // int64: a string in protobuf JSON
	Mode          uint32            `json:"mode"`
	Permissions   string            `json:"permissions"`
	Owner         string            `json:"owner"`
	Group         string            `json:"group"`
	ModifiedTime  string            `json:"modifiedTime,omitempty"`
	SymlinkTarget *string           `json:"symlinkTarget,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	IsSymlink     bool              `json:"isSymlink,omitempty"`
}

type pathRequest struct {
	Path string `json:"path"`
}

type listDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type entryResponse struct {
	Entry *entryInfo `json:"entry"`
}

type listDirResponse struct {
	Entries []*entryInfo `json:"entries"`
}

type watchRequest struct {
	Path               string `json:"path"`
	Recursive          bool   `json:"recursive"`
	IncludeEntry       bool   `json:"includeEntry"`
	AllowNetworkMounts bool   `json:"allowNetworkMounts"`
}

const (
	eventCreate = "EVENT_TYPE_CREATE"
	eventWrite  = "EVENT_TYPE_WRITE"
	eventRemove = "EVENT_TYPE_REMOVE"
	eventRename = "EVENT_TYPE_RENAME"
	eventChmod  = "EVENT_TYPE_CHMOD"
)

type filesystemEvent struct {
	Name  string     `json:"name"`
	Type  string     `json:"type"`
	Entry *entryInfo `json:"entry,omitempty"`
}

type watchDirResponse struct {
	Start      *empty           `json:"start,omitempty"`
	Filesystem *filesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *empty           `json:"keepalive,omitempty"`
}

type watcherIDRequest struct {
	WatcherID string `json:"watcherId"`
}

type createWatcherResponse struct {
	WatcherID string `json:"watcherId"`
}

type watcherEventsResponse struct {
	Events []filesystemEvent `json:"events"`
}
