package server

import (
	"net"
	"testing"
)

func TestVMRef(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/vms/web":            "web",
		"/v1/vms/web/exec":       "web",
		"/v1/vms/web/files/a/b":  "web",
		"/v1/vms":                "",
		"/v1/vms/":               "",
		"/v1/nodes/web":          "",
		"/v1/vmsx/web":           "",
		"/v1/vms/vm-1a2b/events": "vm-1a2b",
	} {
		if got := vmRef(path); got != want {
			t.Errorf("vmRef(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestPeerAdvertise(t *testing.T) {
	for _, c := range []struct {
		ln                  *net.TCPAddr
		advertise, api, out string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7071}, "", "127.0.0.1:7070", "127.0.0.1:7071"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 7071}, "10.0.0.5:7070", "0.0.0.0:7070", "10.0.0.5:7071"},
		{&net.TCPAddr{IP: net.IPv6zero, Port: 7071}, "", "192.0.2.1:7070", "192.0.2.1:7071"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 7071}, "node-a.example", "", "node-a.example:7071"},
	} {
		if got, err := peerAdvertise(c.ln, c.advertise, c.api); err != nil || got != c.out {
			t.Errorf("peerAdvertise(%v, %q, %q) = %q, %v; want %q", c.ln, c.advertise, c.api, got, err, c.out)
		}
	}
	// Every interface for both, and nothing advertised: no node could
	// dial the address.
	if got, err := peerAdvertise(&net.TCPAddr{IP: net.IPv4zero, Port: 7071}, "", "0.0.0.0:7070"); err == nil {
		t.Errorf("peerAdvertise on every interface without --advertise = %q, want an error", got)
	}
}
