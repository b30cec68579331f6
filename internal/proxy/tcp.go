package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

type tcpKey struct {
	vmID string
	port int
}

// tcpListener is one raw TCP exposure: a host listener whose connections
// are piped to a port inside the VM.
type tcpListener struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// ExposeTCP listens on addr (host:port, port 0 = any) and pipes every
// connection to port inside the VM. It returns the bound address. Exposing
// the same VM port again replaces the old listener.
func (p *Proxy) ExposeTCP(vmID string, port int, addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listen %s: %w", addr, err)
	}
	l := &tcpListener{ln: ln, conns: map[net.Conn]struct{}{}}
	k := tcpKey{vmID, port}
	p.tcpMu.Lock()
	old := p.tcp[k]
	p.tcp[k] = l
	p.tcpMu.Unlock()
	if old != nil {
		old.close()
	}
	go l.serve(p, vmID, port)
	return ln.Addr().String(), nil
}

// UnexposeTCP closes the listener of a VM port (and its connections).
func (p *Proxy) UnexposeTCP(vmID string, port int) {
	p.tcpMu.Lock()
	l := p.tcp[tcpKey{vmID, port}]
	delete(p.tcp, tcpKey{vmID, port})
	p.tcpMu.Unlock()
	if l != nil {
		l.close()
	}
}

// ForgetVM closes every TCP exposure of a VM.
func (p *Proxy) ForgetVM(vmID string) {
	p.tcpMu.Lock()
	var ls []*tcpListener
	for k, l := range p.tcp {
		if k.vmID == vmID {
			ls = append(ls, l)
			delete(p.tcp, k)
		}
	}
	p.tcpMu.Unlock()
	for _, l := range ls {
		l.close()
	}
}

func (l *tcpListener) serve(p *Proxy, vmID string, port int) {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go func() {
			defer l.wg.Done()
			defer p.cfg.VMs.Hold(vmID)()
			defer func() {
				l.mu.Lock()
				delete(l.conns, c)
				l.mu.Unlock()
				c.Close()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a wake may take a while
			g, err := p.cfg.VMs.DialPort(ctx, vmID, port)
			cancel()
			if err != nil {
				p.log.Info("tcp exposure: dial failed", "vm", vmID, "port", port, "err", err)
				return
			}
			pipe(c, g)
		}()
	}
}

func (l *tcpListener) close() {
	l.ln.Close()
	l.mu.Lock()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// pipe copies both ways with half-close, then closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		io.CopyBuffer(b, a, make([]byte, 64<<10))
		if cw, ok := b.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			b.Close()
		}
		close(done)
	}()
	io.CopyBuffer(a, b, make([]byte, 64<<10))
	if cw, ok := a.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	a.Close()
	b.Close()
}
