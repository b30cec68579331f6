package proxy

import (
	"io"
	"net/http"
)

// BoundBody makes a relayed request's body end at its Content-Length
// without one more read of the client's body. Go's transport copies a body
// of known length and then reads once more to check that nothing follows;
// by then the upstream has the whole body and may have answered, the relay
// has written the answer's header, and Go's server has closed the client's
// body (a handler that is not full duplex may not read it after answering).
// That last read then fails ("http: invalid Read on closed Body"), the
// transport takes it for a broken request and closes the upstream
// connection, and the answer streaming back is cut (seen under load as a
// code-interpreter stream that ends without its end event). A body of
// unknown length (chunked) keeps that race: its end is only known by
// reading it.
func BoundBody(r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength <= 0 {
		return
	}
	// A LimitReader at its limit answers EOF without reading what it wraps.
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.LimitReader(r.Body, r.ContentLength), r.Body}
}
