package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
)

// tcpListeners are the guest-side listeners of remote forwards (ssh -R),
// each alive while its listen stream is open (see guest.PathTCPListen).
type tcpListeners struct {
	mu   sync.Mutex
	next int
	ls   map[string]*tcpListener
}

type tcpListener struct {
	ln      net.Listener
	mu      sync.Mutex
	next    int
	pending map[string]*net.TCPConn // accepted, not yet claimed by the host
}

func (a *Agent) registerTCPListen(mux *http.ServeMux) {
	t := &tcpListeners{ls: map[string]*tcpListener{}}
	mux.HandleFunc("POST "+guest.PathTCPListen, t.handleListen)
	mux.HandleFunc("POST "+guest.PathTCPAccept, t.handleAccept)
}

func (t *tcpListeners) handleListen(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), guest.TCPListenUpgrade) {
		writeError(w, http.StatusBadRequest, "invalid", "tcp listen needs Upgrade: "+guest.TCPListenUpgrade)
		return
	}
	q := r.URL.Query()
	host := strings.TrimSuffix(strings.TrimPrefix(q.Get("host"), "["), "]")
	if host == "" {
		host = "127.0.0.1"
	}
	port, err := strconv.Atoi(q.Get("port"))
	if err != nil || port < 0 || port > 65535 {
		writeError(w, http.StatusBadRequest, "invalid", "port must be 0..65535, got "+strconv.Quote(q.Get("port")))
		return
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		status, code := http.StatusBadRequest, "invalid"
		if errors.Is(err, syscall.EADDRINUSE) {
			status, code = http.StatusConflict, "conflict"
		}
		writeError(w, status, code, err.Error())
		return
	}
	conn, br, ok := switchProtocols(w, guest.TCPListenUpgrade)
	if !ok {
		ln.Close()
		return
	}
	defer conn.Close()
	l := &tcpListener{ln: ln, pending: map[string]*net.TCPConn{}}
	t.mu.Lock()
	t.next++
	id := "l" + strconv.Itoa(t.next)
	t.ls[id] = l
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.ls, id)
		t.mu.Unlock()
		ln.Close()
		l.mu.Lock()
		for _, c := range l.pending {
			c.Close()
		}
		l.pending = nil
		l.mu.Unlock()
	}()

	// Only this goroutine writes lines to the stream.
	writeLine := func(v any) error {
		b, _ := json.Marshal(v)
		_, err := conn.Write(append(b, '\n'))
		return err
	}
	if err := writeLine(guest.TCPListening{Listener: id, Port: ln.Addr().(*net.TCPAddr).Port}); err != nil {
		return
	}
	// The listener lives until the host closes the stream.
	go func() {
		io.Copy(io.Discard, br)
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		tc := c.(*net.TCPConn)
		l.mu.Lock()
		if l.pending == nil {
			l.mu.Unlock()
			tc.Close()
			return
		}
		l.next++
		cid := "c" + strconv.Itoa(l.next)
		l.pending[cid] = tc
		l.mu.Unlock()
		time.AfterFunc(guest.TCPClaimTimeout, func() {
			if c := l.claim(cid); c != nil {
				c.Close()
			}
		})
		if err := writeLine(guest.TCPAccepted{Conn: cid, Remote: tc.RemoteAddr().String()}); err != nil {
			return
		}
	}
}

// claim takes a pending connection, or returns nil.
func (l *tcpListener) claim(id string) *net.TCPConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.pending[id]
	delete(l.pending, id)
	return c
}

func (t *tcpListeners) handleAccept(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), guest.TCPUpgrade) {
		writeError(w, http.StatusBadRequest, "invalid", "tcp accept needs Upgrade: "+guest.TCPUpgrade)
		return
	}
	q := r.URL.Query()
	t.mu.Lock()
	l := t.ls[q.Get("listener")]
	t.mu.Unlock()
	var tc *net.TCPConn
	if l != nil {
		tc = l.claim(q.Get("conn"))
	}
	if tc == nil {
		writeError(w, http.StatusNotFound, "not_found", "no pending connection "+q.Get("conn")+" on listener "+q.Get("listener"))
		return
	}
	defer tc.Close()
	conn, br, ok := switchProtocols(w, guest.TCPUpgrade)
	if !ok {
		return
	}
	defer conn.Close()
	proxyTCPHalfClose(conn, br, tc)
}

// proxyTCPHalfClose copies both ways with half-closes in both directions:
// a client in the guest that shuts down its sending side (nc -N, an HTTP
// client) still gets the answer. It ends when both directions have.
func proxyTCPHalfClose(conn net.Conn, br *bufio.Reader, tc *net.TCPConn) {
	up := make(chan struct{})
	go func() {
		defer close(up)
		if _, err := io.Copy(tc, br); err == nil {
			tc.CloseWrite()
		} else {
			tc.Close()
		}
	}()
	if _, err := io.Copy(conn, tc); err == nil {
		conn.Close() // a yamux Close half-closes: the host sees EOF
	} else {
		tc.Close()
		conn.Close()
		conn.SetReadDeadline(time.Now())
	}
	<-up
}
