package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/cluster"
	"github.com/agentvm/agentvm/internal/sshgw"
	"github.com/agentvm/agentvm/internal/store"
	"golang.org/x/crypto/ssh"
)

// SSH logins through any node: the gateway a client reaches asks
// forwardSSH whether another node runs the VM, and if so relays the login
// to that node's gateway over an upgraded request to its peer listener
// (sshPeer), which names the caller as every forwarded request does.

// sshUpgrade is the Upgrade protocol of a relayed SSH login.
const sshUpgrade = "agentvm-ssh"

// sshHostKeyMeta is the meta key of the cluster's SSH host key: every node
// shows the same, so a client behind a load balancer sees one host.
const sshHostKeyMeta = "ssh_host_key"

// clusterSSHKey is the cluster's SSH host key: the key file (path) of the
// first node that needs it, kept in the database (as the cluster CA is:
// whoever reads the database runs the cluster already), so that a single
// host that becomes the cluster's first node keeps its host key.
func clusterSSHKey(ctx context.Context, st *store.Store, path string) (ssh.Signer, error) {
	if _, err := sshgw.LoadOrCreateHostKey(path); err != nil {
		return nil, err
	}
	own, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	have, err := clusterSecret(ctx, st, sshHostKeyMeta, string(own))
	if err != nil {
		return nil, err
	}
	signer, err := ssh.ParsePrivateKey([]byte(have))
	if err != nil {
		return nil, fmt.Errorf("cluster ssh host key: %w", err)
	}
	return signer, nil
}

// e2bKeyMeta is the meta key of the cluster's E2B key, which signs envd
// access tokens: a sandbox's token is good on whichever node runs it.
const e2bKeyMeta = "e2b_key"

// clusterSecret is the cluster's secret under meta key key: own, the
// secret of the first node that needs it.
func clusterSecret(ctx context.Context, st *store.Store, key, own string) (string, error) {
	have, err := st.MetaOnce(ctx, key, own)
	if err != nil {
		return "", fmt.Errorf("cluster %s: %w", key, err)
	}
	return have, nil
}

// forwardSSH returns a connection to the gateway of the node that runs
// vmID, serving a login as user by p, when that is another live node; nil
// for a VM this node serves (its own, a lost node's it may take over, or
// none: the gateway's own errors say so).
func (s *Server) forwardSSH(ctx context.Context, vmID, user string, p *auth.Principal, origin string) (net.Conn, error) {
	if s.peers == nil {
		return nil, nil
	}
	v, err := s.store.GetVM(ctx, vmID)
	if err != nil {
		return nil, nil
	}
	n := s.otherLiveNode(v.Node)
	if n == nil {
		return nil, nil
	}
	conn, err := s.peers.upgrade(ctx, n, "/peer/ssh/"+url.PathEscape(v.ID)+"?"+url.Values{"user": {user}, "from": {origin}}.Encode(), sshUpgrade, p)
	if err != nil {
		return nil, fmt.Errorf("the VM runs on node %s: %w", n.Name, err)
	}
	return conn, nil
}

// upgrade opens an upgraded connection to node n's peer listener for path,
// as caller p.
func (pp *peers) upgrade(ctx context.Context, n *store.Node, path, proto string, p *auth.Principal) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: pp.tls.Client(n.ID)}
	conn, err := d.DialContext(ctx, "tcp", n.PeerAddress)
	if err != nil {
		return nil, fmt.Errorf("it did not answer: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	req, _ := http.NewRequest("GET", "https://"+n.PeerAddress+path, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", proto)
	req.Header.Set(principalHeader, p.Claim())
	br := bufio.NewReader(conn)
	var resp *http.Response
	if err = req.Write(conn); err == nil {
		resp, err = http.ReadResponse(br, req)
	}
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("it did not answer: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if msg := apiMessage(b); msg != "" {
			return nil, errors.New(msg)
		}
		return nil, fmt.Errorf("it answered %s", resp.Status)
	}
	return readerConn{conn, br}, nil
}

// apiMessage is the message of an API error body ("" if it is none).
func apiMessage(b []byte) string {
	var e api.Error
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return e.Error.Message
}

// readerConn is a connection whose reads come through r (which buffered
// what followed an HTTP exchange on it).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// sshPeer serves an SSH login another node's gateway relays for the caller
// it names (GET /peer/ssh/{id}, on the peer listener only: outside
// /v1/vms/ no client request is forwarded there). The caller's rights are
// checked here, then the connection is this node's gateway's.
func (s *Server) sshPeer(w http.ResponseWriter, r *http.Request) {
	if s.ssh == nil {
		writeError(w, http.StatusNotFound, api.CodeNotFound, "this node runs no SSH gateway (serve --ssh-listen)")
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), sshUpgrade) {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "this endpoint needs Upgrade: "+sshUpgrade)
		return
	}
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	p := principal(r)
	user, err := sshgw.LoginUser(p, v.ID, r.URL.Query().Get("user"))
	if err != nil {
		writeErr(w, err)
		return
	}
	// Where the client is, as the forwarding node saw it, for the VM's
	// events (a node's word, bounded and printable all the same).
	from := strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return -1
		}
		return r
	}, r.URL.Query().Get("from"))
	if len(from) > 200 {
		from = from[:200]
	}
	node, _ := cluster.NodeOf(r.TLS)
	if n, ok := s.nodes.lookup(s, node); ok {
		node = n.name
	}
	conn, br, ok := switchProtocols(w, sshUpgrade)
	if !ok {
		return
	}
	s.ssh.ServePeer(readerConn{conn, br}, v.ID, user, p, from+" through node "+node)
}
