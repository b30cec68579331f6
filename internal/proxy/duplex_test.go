package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A guest server may answer before it has read all of a request's body
// (a streamed result begins at once): the body goes on reaching it
// through the proxy, and the answer is whole. Without full duplex Go's
// server would take the rest of the body away from the relay when the
// answer began (it waits for it here, while the client waits for the
// answer; under load the relay's read of a closed body cut the stream).
func TestBodyAfterTheAnswerBegins(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "application/x-ndjson")
		fmt.Fprintln(w, `{"type":"start"}`)
		w.(http.Flusher).Flush()
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "{\"type\":\"end\",\"body\":%q,\"err\":%v}\n", b, err != nil)
	}))
	defer backend.Close()
	p, _ := newTestProxy(t, backend.Listener.Addr().String())
	go p.Serve()

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	// The body is chunked: the relay passes each chunk on as it comes.
	fmt.Fprintf(c, "POST /execute HTTP/1.1\r\nHost: 3000-web.localhost\r\nAuthorization: Bearer avm_admin\r\n"+
		"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the answer did not begin before the body ended: %v", err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, "start") {
		// (a fresh reader: the first line is all that has been sent)
		t.Fatalf("first event %q: %v", line, err)
	}
	fmt.Fprintf(c, "6\r\nsecond\r\n0\r\n\r\n")
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the answer was cut: %v (read %q)", err, rest)
	}
	if !strings.Contains(string(rest), `"body":"firstsecond","err":false`) {
		t.Fatalf("the end of the answer: %q", rest)
	}
}
