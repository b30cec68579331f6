package server

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// notSent tells a forward that never reached its node (the node did
// nothing: another may take the create) from one that failed after it
// did (the node may have made the VM).
func TestNotSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			c.Read(buf) // the request arrived; no answer
			c.Close()
		}
	}()
	_, err = http.Post("http://"+addr+"/v1/vms", "application/json", strings.NewReader("{}"))
	if err == nil || notSent(err) {
		t.Fatalf("a request the node read counts as not sent: %v", err)
	}
	ln.Close()
	_, err = http.Post("http://"+addr+"/v1/vms", "application/json", strings.NewReader("{}"))
	if err == nil || !notSent(err) {
		t.Fatalf("a refused connection counts as sent: %v", err)
	}
}
