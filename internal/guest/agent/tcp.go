package agent

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
)

const tcpDialTimeout = 10 * time.Second

// handleTCP dials host:port inside the guest and turns the stream into that
// TCP connection (see guest.PathTCP).
func (a *Agent) handleTCP(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), guest.TCPUpgrade) {
		writeError(w, http.StatusBadRequest, "invalid", "tcp needs Upgrade: "+guest.TCPUpgrade)
		return
	}
	q := r.URL.Query()
	host := q.Get("host")
	if host == "" {
		host = "127.0.0.1"
	}
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	port, err := strconv.Atoi(q.Get("port"))
	if err != nil || port < 1 || port > 65535 {
		writeError(w, http.StatusBadRequest, "invalid", "port must be 1..65535, got "+strconv.Quote(q.Get("port")))
		return
	}
	d := net.Dialer{Timeout: tcpDialTimeout}
	tc, err := d.DialContext(r.Context(), "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		writeError(w, http.StatusBadGateway, "unreachable", err.Error())
		return
	}
	defer tc.Close()
	conn, br, ok := switchProtocols(w, guest.TCPUpgrade)
	if !ok {
		return
	}
	defer conn.Close()
	proxyTCP(conn, br, tc.(*net.TCPConn))
}

// proxyTCP copies both ways. The end of the host's data (stream EOF)
// half-closes the TCP connection; the end of the TCP side's data closes
// everything.
func proxyTCP(conn net.Conn, br *bufio.Reader, tc *net.TCPConn) {
	up := make(chan struct{})
	go func() {
		defer close(up)
		if _, err := io.Copy(tc, br); err == nil {
			tc.CloseWrite()
		} else {
			tc.Close()
		}
	}()
	io.Copy(conn, tc)
	tc.Close()
	conn.Close()
	// A yamux Close only half-closes: end the host->TCP copy explicitly.
	conn.SetReadDeadline(time.Now())
	<-up
}
