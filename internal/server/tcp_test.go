package server

import (
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// A client that half-closes still gets the VM's answer; a revoke after the
// half-close still ends the VM side.
func TestSpliceTCPHalfCloseThenRevoke(t *testing.T) {
	client, clientSrv := tcpPair(t) // client <-> daemon
	vmSide, vm := tcpPair(t)        // daemon <-> VM
	revoked := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		spliceTCP(clientSrv, clientSrv, vmSide, revoked)
	}()

	io.WriteString(client, "ping")
	client.(*net.TCPConn).CloseWrite()
	vm.SetDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(vm) // EOF: the half-close reached the VM side
	if err != nil || string(got) != "ping" {
		t.Fatalf("VM read %q %v", got, err)
	}
	io.WriteString(vm, "pong")
	client.SetDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("answer after half-close: %q %v", buf, err)
	}

	close(revoked)
	clientSrv.Close() // what the revoke does to the client side
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the splice outlived the revoke after a half-close")
	}
	if _, err := vm.Read(buf); err == nil {
		t.Fatal("the VM side is still open after the revoke")
	}
}
