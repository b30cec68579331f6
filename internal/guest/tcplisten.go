package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// TCPListener is a listener inside the guest (see PathTCPListen): it lives
// until Close, or until the agent session ends.
type TCPListener struct {
	c    *Client
	st   *yamux.Stream
	br   *bufio.Reader
	id   string
	port int
	once sync.Once
}

// ListenTCP listens on host:port inside the guest (host "" is 127.0.0.1,
// port 0 picks a free one).
func (c *Client) ListenTCP(ctx context.Context, host string, port int) (*TCPListener, error) {
	q := url.Values{}
	if host != "" {
		q.Set("host", host)
	}
	q.Set("port", strconv.Itoa(port))
	st, br, err := c.upgrade(ctx, PathTCPListen+"?"+q.Encode(), TCPListenUpgrade, nil)
	if err != nil {
		return nil, err
	}
	st.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := readGuestLine(br)
	st.SetReadDeadline(time.Time{})
	var hello TCPListening
	if err == nil {
		err = json.Unmarshal(line, &hello)
	}
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("guest: tcp listen: %w", err)
	}
	return &TCPListener{c: c, st: st, br: br, id: hello.Listener, port: hello.Port}, nil
}

// Port is the port listened on inside the guest.
func (l *TCPListener) Port() int { return l.port }

// Accept waits for the next connection inside the guest and claims it;
// remote is the connecting peer's address inside the guest. A connection
// that cannot be claimed (it waited longer than TCPClaimTimeout) is
// skipped. After Close, or when the agent session ends, it returns an error.
func (l *TCPListener) Accept(ctx context.Context) (conn net.Conn, remote string, err error) {
	for {
		line, err := readGuestLine(l.br)
		if err != nil {
			return nil, "", err
		}
		var a TCPAccepted
		if err := json.Unmarshal(line, &a); err != nil {
			return nil, "", fmt.Errorf("guest: tcp accept: %w", err)
		}
		q := url.Values{"listener": {l.id}, "conn": {a.Conn}}
		st, br, err := l.c.upgrade(ctx, PathTCPAccept+"?"+q.Encode(), TCPUpgrade, nil)
		if err != nil {
			if ctx.Err() != nil || l.c.sess.IsClosed() {
				return nil, "", err
			}
			continue
		}
		return &tcpConn{st: st, br: br, raddr: guestAddr(a.Remote)}, a.Remote, nil
	}
}

// Close stops listening in the guest; connections already accepted stay.
func (l *TCPListener) Close() error {
	l.once.Do(func() {
		l.st.Close()
		l.st.SetReadDeadline(time.Unix(1, 0)) // end a pending Accept
	})
	return nil
}
