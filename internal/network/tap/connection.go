// Copied from github.com/containers/gvisor-tap-vsock v0.8.9 (pkg/tap), Apache License 2.0,
// without its debug packet dumps: those pulled in gopacket, whose package init alone
// cost every agentvm CLI invocation ~30 ms. Keep in sync with upstream.

package tap

import (
	"net"
)

type protocolConn struct {
	net.Conn
	protocolImpl protocol
}
