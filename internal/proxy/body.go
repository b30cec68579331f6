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
	r.Body = &boundBody{rc: r.Body, left: r.ContentLength}
}

type boundBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *boundBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	if b.left <= 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

func (b *boundBody) Close() error { return b.rc.Close() }
