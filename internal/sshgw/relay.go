package sshgw

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"golang.org/x/crypto/ssh"
)

// In a cluster any node's gateway takes a login for any VM. When another
// node runs the VM, the gateway the client reached authenticates the
// client as usual, then opens an SSH connection of its own to the owner's
// gateway over a connection Config.Forward gives it (TLS between nodes,
// authenticated by node certificates), and relays every channel and
// request between the two: sessions, exit statuses, sftp, -L and -R
// forwards. The owner serves that connection with ServePeer, as the caller
// the forwarding node names, and checks the caller's rights itself.

// ServePeer serves an SSH connection another node's gateway opened for a
// client it authenticated as p, logging in as user to vmID (the owner has
// checked p may, with LoginUser, and closes nc if p's token is revoked). origin says where
// the client is, for the VM's events. It returns when the connection ends.
func (g *Gateway) ServePeer(nc net.Conn, vmID, user string, p *auth.Principal, origin string) {
	if !g.track(nc) {
		nc.Close()
		return
	}
	defer g.untrack(nc)
	perms := permissions(vmID, user, p)
	cfg := &ssh.ServerConfig{
		// The forwarding node's certificate was checked by TLS, and the
		// caller by the handler that handed this connection over.
		NoClientAuth:         true,
		NoClientAuthCallback: func(ssh.ConnMetadata) (*ssh.Permissions, error) { return perms, nil },
		ServerVersion:        g.sshCfg.ServerVersion,
	}
	cfg.AddHostKey(g.signer)
	g.handleConn(nc, cfg, origin, func() {})
}

// track registers a connection for Close; false when the gateway is closed.
func (g *Gateway) track(nc net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.conns[nc] = struct{}{}
	g.wg.Add(1)
	return true
}

func (g *Gateway) untrack(nc net.Conn) {
	g.mu.Lock()
	delete(g.conns, nc)
	g.mu.Unlock()
	nc.Close()
	g.wg.Done()
}

// relay logs in to the owner's gateway over up and relays down's channels
// and requests there, and the owner's back, until either side ends.
func (g *Gateway) relay(down *ssh.ServerConn, downChans <-chan ssh.NewChannel, downReqs <-chan *ssh.Request, up net.Conn) error {
	// The handshake must finish in time; the node at the other end was
	// authenticated by TLS, so its host key need not be checked again.
	deadline := time.AfterFunc(g.authTimeout, func() { up.Close() })
	cc, upChans, upReqs, err := ssh.NewClientConn(up, "owner", &ssh.ClientConfig{
		User: down.User(), HostKeyCallback: ssh.InsecureIgnoreHostKey(), ClientVersion: "SSH-2.0-agentvm-node",
	})
	if !deadline.Stop() && err == nil {
		err = errors.New("the owner's gateway did not answer in time")
	}
	if err != nil {
		up.Close()
		return err
	}
	var wg sync.WaitGroup
	defer func() {
		cc.Close()
		down.Close()
		wg.Wait()
	}()
	go func() {
		cc.Wait()
		down.Close()
	}()
	wg.Add(3)
	go func() { defer wg.Done(); passGlobal(upReqs, down) }()
	go func() { defer wg.Done(); passGlobal(downReqs, cc) }()
	go func() {
		defer wg.Done()
		for nch := range upChans { // -R: the owner opens forwarded-tcpip channels
			wg.Add(1)
			go func() { defer wg.Done(); pipeChannel(nch, down) }()
		}
	}()
	for nch := range downChans {
		wg.Add(1)
		go func() { defer wg.Done(); pipeChannel(nch, cc) }()
	}
	return nil
}

// passGlobal passes one side's global requests (keepalives, tcpip-forward
// and its cancel) to the other, and the answers back.
func passGlobal(reqs <-chan *ssh.Request, to ssh.Conn) {
	for r := range reqs {
		ok, payload, err := to.SendRequest(r.Type, r.WantReply, r.Payload)
		if r.WantReply {
			r.Reply(ok && err == nil, payload)
		}
	}
}

// pipeChannel opens the channel nch asks for on the other side (to), with
// the same type and data, answers nch as that side did, and pipes them.
func pipeChannel(nch ssh.NewChannel, to ssh.Conn) {
	b, bReqs, err := to.OpenChannel(nch.ChannelType(), nch.ExtraData())
	if err != nil {
		var oe *ssh.OpenChannelError
		if errors.As(err, &oe) {
			nch.Reject(oe.Reason, oe.Message)
		} else {
			nch.Reject(ssh.ConnectionFailed, err.Error())
		}
		return
	}
	a, aReqs, err := nch.Accept()
	if err != nil {
		go ssh.DiscardRequests(bReqs)
		b.Close()
		return
	}
	pipe(a, aReqs, b, bReqs)
}

// pipe copies two channels' data (and extended data) both ways, passes on
// each one's end of data, requests (pty-req, exec, window-change, signals,
// exit-status...) and close. A side's exit-status or exit-signal is passed
// on after all its data, as an SSH server sends them.
func pipe(a ssh.Channel, aReqs <-chan *ssh.Request, b ssh.Channel, bReqs <-chan *ssh.Request) {
	aDone, bDone := copyHalf(b, a), copyHalf(a, b)
	// aAsks (bAsks) is held while a request of a's (b's) waits for the
	// other side's answer: a side is closed only once its answer is sent
	// (else an exec's reply could arrive after the close).
	var aAsks, bAsks sync.Mutex
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		passRequests(aReqs, b, aDone, &aAsks)
		<-aDone
		bAsks.Lock()
		b.Close()
		bAsks.Unlock()
	}()
	passRequests(bReqs, a, bDone, &bAsks)
	<-bDone
	aAsks.Lock()
	a.Close()
	aAsks.Unlock()
	<-closed
}

// copyHalf copies src's data and extended data to dst, then sends dst's
// end of data; the channel it returns is closed when that is done.
func copyHalf(dst, src ssh.Channel) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); io.Copy(dst, src) }()
	go func() { defer wg.Done(); io.Copy(dst.Stderr(), src.Stderr()) }()
	go func() {
		wg.Wait()
		dst.CloseWrite()
		close(done)
	}()
	return done
}

// passRequests passes a channel's requests to the other channel, and the
// answers back, until the channel closes; asking is held meanwhile.
func passRequests(reqs <-chan *ssh.Request, to ssh.Channel, dataDone <-chan struct{}, asking *sync.Mutex) {
	for r := range reqs {
		if r.Type == "exit-status" || r.Type == "exit-signal" {
			<-dataDone
		}
		asking.Lock()
		ok, err := to.SendRequest(r.Type, r.WantReply, r.Payload)
		if r.WantReply {
			r.Reply(ok && err == nil, nil)
		}
		asking.Unlock()
	}
}

// forward serves a login for a VM another node runs: relayed to that
// node's gateway over up, or when the node could not be reached (err),
// every channel the client opens is refused with the reason.
func (g *Gateway) forward(sc *ssh.ServerConn, chans <-chan ssh.NewChannel, reqs <-chan *ssh.Request, up net.Conn, err error) {
	vmID := sc.Permissions.Extensions[extVM]
	if err == nil {
		g.log.Info("ssh login relayed to the VM's node", "vm", vmID, "user", sc.User(), "remote", sc.RemoteAddr().String())
		if err = g.relay(sc, chans, reqs, up); err == nil {
			return
		}
	}
	g.log.Warn("ssh login not relayed to the VM's node", "vm", vmID, "err", err)
	go ssh.DiscardRequests(reqs)
	for nch := range chans {
		nch.Reject(ssh.ConnectionFailed, err.Error())
	}
}
