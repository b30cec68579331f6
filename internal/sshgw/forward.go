package sshgw

import (
	"context"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/crypto/ssh"
)

// directTCPIP serves ssh -L: the guest agent dials the target from inside the
// VM, as root. A login limited to one guest user does not reach the guest's
// loopback that way: servers there may trust root (the code interpreter
// answers only root and its own user), which that user is not
// (docs/security.md).
func (g *Gateway) directTCPIP(connCtx context.Context, vmID string, nch ssh.NewChannel, userLimited bool) {
	var req struct {
		Host     string
		Port     uint32
		OrigHost string
		OrigPort uint32
	}
	if err := ssh.Unmarshal(nch.ExtraData(), &req); err != nil {
		nch.Reject(ssh.ConnectionFailed, "bad direct-tcpip request")
		return
	}
	if req.Port == 0 || req.Port > 65535 {
		nch.Reject(ssh.ConnectionFailed, "bad port")
		return
	}
	host := req.Host
	if host == "localhost" || host == "" {
		host = "127.0.0.1"
	}
	// A name is resolved in the guest (its own hostname is 127.0.1.1), so
	// such a login forwards to addresses only.
	if ip := net.ParseIP(host); userLimited && (ip == nil || ip.IsLoopback() || ip.IsUnspecified()) {
		nch.Reject(ssh.Prohibited, "this token is limited to one guest user: its ssh -L reaches addresses other than the VM's loopback only, given as IP addresses (the agent dials as root); use a token without --user for the loopback")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, gc, err := g.cfg.VMs.Guest(ctx, vmID)
	var conn net.Conn
	if err == nil {
		conn, err = gc.DialTCP(ctx, host, int(req.Port))
	}
	cancel()
	if err != nil {
		nch.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	defer conn.Close()
	defer context.AfterFunc(connCtx, func() { conn.Close() })()
	ch, reqs, err := nch.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	go ssh.DiscardRequests(reqs)
	spliceChannel(ch, conn)
}

// spliceChannel copies between an SSH channel and a connection both ways,
// passing each side's end of data on as a half-close, until both are done.
func spliceChannel(ch ssh.Channel, conn net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyBuf(conn, ch)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}()
	copyBuf(ch, conn)
	ch.CloseWrite()
	<-done
}

// forwards serves one SSH connection's global requests: ssh -R
// (tcpip-forward and cancel-tcpip-forward), each a listener inside the
// guest whose connections come back as forwarded-tcpip channels.
type forwards struct {
	g               *Gateway
	sc              *ssh.ServerConn
	vmID, user, who string

	mu     sync.Mutex
	closed bool
	ls     map[string]*guest.TCPListener // by the client's "address:port"
}

// tcpipForward is the payload of tcpip-forward and cancel-tcpip-forward.
type tcpipForward struct {
	Addr string
	Port uint32
}

func (f *forwards) serve(reqs <-chan *ssh.Request) {
	for req := range reqs {
		switch req.Type {
		case "tcpip-forward":
			port, err := f.listen(req.Payload)
			if err != nil {
				f.g.log.Info("ssh -R refused", "vm", f.vmID, "err", err)
				req.Reply(false, nil)
				continue
			}
			req.Reply(true, ssh.Marshal(struct{ Port uint32 }{uint32(port)}))
		case "cancel-tcpip-forward":
			var r tcpipForward
			ok := ssh.Unmarshal(req.Payload, &r) == nil && f.cancel(r)
			req.Reply(ok, nil)
		default:
			if req.WantReply {
				req.Reply(false, nil)
			}
		}
	}
}

// guestBindHost maps the address an SSH client asks to bind to a guest
// address, as sshd does: "" and localhost are the loopback, "*" is every
// address.
func guestBindHost(a string) string {
	switch a {
	case "", "localhost":
		return "127.0.0.1"
	case "*":
		return "0.0.0.0"
	}
	return a
}

func (f *forwards) listen(payload []byte) (int, error) {
	var r tcpipForward
	if err := ssh.Unmarshal(payload, &r); err != nil {
		return 0, err
	}
	if r.Port > 65535 {
		return 0, errString("bad port")
	}
	if f.user != "root" && r.Port != 0 && r.Port < 1024 {
		return 0, errString("only root may listen on a port below 1024")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, gc, err := f.g.cfg.VMs.Guest(ctx, f.vmID)
	if err != nil {
		return 0, err
	}
	l, err := gc.ListenTCP(ctx, guestBindHost(r.Addr), int(r.Port))
	if err != nil {
		return 0, err
	}
	// A client cancels a port-0 forward with the port it was given.
	key := net.JoinHostPort(r.Addr, strconv.Itoa(l.Port()))
	f.mu.Lock()
	if f.closed || f.ls[key] != nil {
		f.mu.Unlock()
		l.Close()
		return 0, errString("already forwarded: " + key)
	}
	f.ls[key] = l
	f.mu.Unlock()
	f.g.cfg.VMs.Event(f.vmID, "ssh", f.who, "ssh -R: listening on %s port %d in the VM", guestBindHost(r.Addr), l.Port())
	go f.accept(l, key, r.Addr, l.Port())
	return l.Port(), nil
}

// accept hands every connection made to l inside the guest to the client.
// When the listener ends (cancelled, or the guest agent session is gone),
// its forward is forgotten, so the client may ask for it again.
func (f *forwards) accept(l *guest.TCPListener, key, addr string, port int) {
	defer func() {
		l.Close()
		f.mu.Lock()
		if f.ls[key] == l {
			delete(f.ls, key)
		}
		f.mu.Unlock()
	}()
	for {
		conn, remote, err := l.Accept(context.Background())
		if err != nil {
			return
		}
		go f.forward(conn, remote, addr, port)
	}
}

func (f *forwards) forward(conn net.Conn, remote, addr string, port int) {
	defer conn.Close()
	defer f.g.cfg.VMs.Hold(f.vmID)()
	oh, op, _ := net.SplitHostPort(remote)
	opn, _ := strconv.Atoi(op)
	ch, reqs, err := f.sc.OpenChannel("forwarded-tcpip", ssh.Marshal(struct {
		Addr       string
		Port       uint32
		OriginAddr string
		OriginPort uint32
	}{addr, uint32(port), oh, uint32(opn)}))
	if err != nil {
		return
	}
	defer ch.Close()
	go ssh.DiscardRequests(reqs)
	spliceChannel(ch, conn)
}

func (f *forwards) cancel(r tcpipForward) bool {
	key := net.JoinHostPort(r.Addr, strconv.Itoa(int(r.Port)))
	f.mu.Lock()
	l := f.ls[key]
	delete(f.ls, key)
	f.mu.Unlock()
	if l == nil {
		return false
	}
	l.Close()
	return true
}

// closeAll ends every forward when the SSH connection ends.
func (f *forwards) closeAll() {
	f.mu.Lock()
	f.closed = true
	ls := f.ls
	f.ls = nil
	f.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
}

type errString string

func (e errString) Error() string { return string(e) }
