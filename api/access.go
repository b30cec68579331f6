package api

import "time"

// Token permissions.
const (
	PermExec    = "exec"    // exec, processes, TCP to the VM's ports
	PermFiles   = "files"   // the files API
	PermSSH     = "ssh"     // the SSH gateway (shell, exec, sftp/scp/rsync, -L)
	PermTerm    = "term"    // terminals
	PermPreview = "preview" // preview URLs of non-public ports
	PermDisplay = "display" // screenshots and the live view (VNC) of the VM's display
)

// AllPerms lists every permission a token can hold.
var AllPerms = []string{PermExec, PermFiles, PermSSH, PermTerm, PermPreview, PermDisplay}

// CreateTokenRequest is the body of POST /v1/tokens.
type CreateTokenRequest struct {
	VM string `json:"vm"` // id or name
	// Allow lists permissions; empty means all of AllPerms.
	Allow []string `json:"allow,omitempty"`
	// TTL is a Go duration ("1h", "15m"); default 1h, at most 8760h.
	TTL string `json:"ttl,omitempty"`
	// User limits the token to one guest user (e.g. "agent"): requests that
	// name no user act as it, requests for any other user are refused.
	User string `json:"user,omitempty"`
	Name string `json:"name,omitempty"`
	// SSHKeys are public keys in authorized_keys format that log in to the
	// SSH gateway with this token's scope.
	SSHKeys []string `json:"ssh_keys,omitempty"`
	// E2B makes the secret an E2B API key (e2b_ and 40 hex digits), for the
	// E2B-compatible API. Without a VM it is an admin key (default TTL
	// 8760h): it creates and manages every sandbox.
	E2B bool `json:"e2b,omitempty"`
	// Admin makes an admin token (no VM, permissions, user or SSH keys):
	// the admin's whole access, kept in the database, so that in a
	// cluster it works on every node (the admin.token file is one node's),
	// and revocable (its connections end with it). Default TTL 1h.
	Admin bool `json:"admin,omitempty"`
}

// Token describes a scoped token or a stored admin token (no VMID, Allow
// ["admin"]). Secret is only returned by create.
type Token struct {
	ID        string    `json:"id"`
	Secret    string    `json:"token,omitempty"`
	VMID      string    `json:"vm_id"`
	Allow     []string  `json:"allow"`
	User      string    `json:"user,omitempty"`
	Name      string    `json:"name,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	SSHKeys   []string  `json:"ssh_keys,omitempty"`
	// Repo and Branches: a repository token's repository (VMID is then
	// "", Allow "read" or "read","write") and the glob the branches it
	// may push to must match ("" = any).
	Repo     string `json:"repo,omitempty"`
	Branches string `json:"branches,omitempty"`
}

// ListTokensResponse is the body of GET /v1/tokens.
type ListTokensResponse struct {
	Tokens []Token `json:"tokens"`
}

// SSHInfo is the body of GET /v1/ssh: where the gateway listens and its host key.
type SSHInfo struct {
	Enabled bool   `json:"enabled"`
	Listen  string `json:"listen,omitempty"`
	// HostKey is the gateway's public host key in authorized_keys format.
	HostKey string `json:"host_key,omitempty"`
}

// FileInfo describes a file inside a VM (lstat: a symlink is itself).
type FileInfo struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type"` // file, dir, symlink, other
	Size       int64     `json:"size"`
	Mode       uint32    `json:"mode"` // permission bits, 07777
	UID        uint32    `json:"uid"`
	GID        uint32    `json:"gid"`
	Owner      string    `json:"owner,omitempty"`
	Group      string    `json:"group,omitempty"`
	ModTime    time.Time `json:"mtime"`
	LinkTarget string    `json:"link_target,omitempty"`
	// Metadata is the file's metadata (extended attributes user.e2b.*),
	// written with PUT /v1/vms/{id}/files?meta=key=value.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// FileList is the body of GET /v1/vms/{id}/files/list.
type FileList struct {
	Path    string     `json:"path"`
	Entries []FileInfo `json:"entries"`
}

// MkdirRequest is the body of POST /v1/vms/{id}/files/mkdir (mkdir -p).
type MkdirRequest struct {
	Path string `json:"path"`
	User string `json:"user,omitempty"`
	Mode uint32 `json:"mode,omitempty"`
}

// RenameRequest is the body of POST /v1/vms/{id}/files/rename.
type RenameRequest struct {
	From      string `json:"from"`
	To        string `json:"to"`
	User      string `json:"user,omitempty"`
	Overwrite bool   `json:"overwrite,omitempty"`
}

// TarResult is the answer of a tar upload.
type TarResult struct {
	Files int   `json:"files"`
	Dirs  int   `json:"dirs"`
	Bytes int64 `json:"bytes"`
}

// TermCreate is the body of POST /v1/vms/{id}/terminals.
type TermCreate struct {
	Name string            `json:"name,omitempty"`
	Argv []string          `json:"argv,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	User string            `json:"user,omitempty"`
	Cols int               `json:"cols,omitempty"`
	Rows int               `json:"rows,omitempty"`
}

// TermInfo describes a terminal session inside a VM.
type TermInfo struct {
	Name      string    `json:"name"`
	PID       int       `json:"pid"`
	User      string    `json:"user"`
	Argv      []string  `json:"argv"`
	Cols      int       `json:"cols"`
	Rows      int       `json:"rows"`
	Clients   int       `json:"clients"`
	CreatedAt time.Time `json:"created_at"`
	Exited    bool      `json:"exited"`
	ExitCode  int       `json:"exit_code"`
	Signal    string    `json:"signal,omitempty"`
}

// TermList is the body of GET /v1/vms/{id}/terminals.
type TermList struct {
	Terminals []TermInfo `json:"terminals"`
}

// TermControl is a text (JSON) WebSocket message on a terminal connection.
// Client to server: {"type":"resize","cols":C,"rows":R} or
// {"type":"signal","signal":"INT"}. Server to client, last message:
// {"type":"exit","exit_code":N,"signal":"..."}. Binary messages carry the
// terminal's bytes in both directions.
type TermControl struct {
	Type     string `json:"type"`
	Cols     int    `json:"cols,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	Signal   string `json:"signal,omitempty"`
	ExitCode int    `json:"exit_code,omitempty"`
}

// ExposeRequest is the body of POST /v1/vms/{id}/ports.
type ExposeRequest struct {
	Port int `json:"port"`
	// Public previews need no token; private ones need a token with preview.
	Public bool `json:"public,omitempty"`
	// TCP maps a host port to the VM port instead of an HTTP preview.
	TCP      bool   `json:"tcp,omitempty"`
	HostPort int    `json:"host_port,omitempty"` // tcp: 0 picks a free port
	HostAddr string `json:"host_addr,omitempty"` // tcp: default 127.0.0.1
}

// Port is an exposed port of a VM.
type Port struct {
	Port   int    `json:"port"`
	Kind   string `json:"kind"` // http or tcp
	Public bool   `json:"public,omitempty"`
	// URL is the preview URL (http).
	URL string `json:"url,omitempty"`
	// Host is the host address that reaches the port (tcp).
	Host      string    `json:"host,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// ListPortsResponse is the body of GET /v1/vms/{id}/ports.
type ListPortsResponse struct {
	Ports []Port `json:"ports"`
}

// Domain maps a custom host name to a VM port through the preview proxy.
type Domain struct {
	Domain    string    `json:"domain"`
	VM        string    `json:"vm"`
	Port      int       `json:"port"`
	CreatedAt time.Time `json:"created_at,omitempty"`
}

// ListDomainsResponse is the body of GET /v1/domains.
type ListDomainsResponse struct {
	Domains []Domain `json:"domains"`
}

// Egress is a VM's or a private network's egress policy.
type Egress struct {
	// Mode: public (default: the internet; loopback, link-local, private
	// ranges and the host stay blocked), deny (nothing) or allow (only Allow).
	Mode string `json:"mode,omitempty"`
	// Allow lists CIDRs ("203.0.113.0/24", a bare IP) and domain names
	// ("deb.debian.org" also admits its subdomains), for mode allow.
	Allow []string `json:"allow,omitempty"`
	// AllowHost lists host ports the VM may reach on the host's loopback
	// through its host gateway address (host.agentvm.internal, .254 of its
	// subnet). agentvm's own ports are always refused.
	AllowHost []int `json:"allow_host,omitempty"`
}

// NetworkInfo is a private network.
type NetworkInfo struct {
	Name      string    `json:"name"`
	Egress    *Egress   `json:"egress,omitempty"`
	VMs       []string  `json:"vms"`
	CreatedAt time.Time `json:"created_at"`
}

// CreateNetworkRequest is the body of POST /v1/networks.
type CreateNetworkRequest struct {
	Name   string  `json:"name"`
	Egress *Egress `json:"egress,omitempty"`
}

// ListNetworksResponse is the body of GET /v1/networks.
type ListNetworksResponse struct {
	Networks []NetworkInfo `json:"networks"`
}

// AttachNetworkRequest is the body of POST /v1/vms/{id}/network ("" detaches).
type AttachNetworkRequest struct {
	Network string `json:"network"`
}
