package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// serverBody acts as Go's server does with a request's body once the
// handler has begun its answer: a read past the body's last byte, made
// after the answer's header was written, fails as a closed body does.
type serverBody struct {
	data     *strings.Reader
	answered <-chan struct{}
}

func (b *serverBody) Read(p []byte) (int, error) {
	if b.data.Len() > 0 {
		return b.data.Read(p)
	}
	select {
	case <-b.answered:
	case <-time.After(30 * time.Second):
	}
	return 0, errors.New("http: invalid Read on closed Body")
}

func (b *serverBody) Close() error { return nil }

// headerSignal closes answered when the answer's header is written.
type headerSignal struct {
	*httptest.ResponseRecorder
	once     sync.Once
	answered chan struct{}
}

func (h *headerSignal) WriteHeader(code int) {
	h.ResponseRecorder.WriteHeader(code)
	h.once.Do(func() { close(h.answered) })
}

func (h *headerSignal) Unwrap() http.ResponseWriter { return h.ResponseRecorder }

// A guest server that answers as soon as it has a request's body (as the
// code interpreter's does) streams its whole answer back through the
// proxy, though the client's body can no longer be read once the answer
// has begun.
func TestStreamAfterTheBody(t *testing.T) {
	const lines = 20
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i := range lines {
			fmt.Fprintf(w, "{\"line\":%d,\"of\":%q}\n", i, body)
			w.(http.Flusher).Flush()
			time.Sleep(10 * time.Millisecond)
		}
		fmt.Fprintln(w, `{"end":true}`)
	}))
	defer backend.Close()
	p, _ := newTestProxy(t, backend.Listener.Addr().String())

	w := &headerSignal{ResponseRecorder: httptest.NewRecorder(), answered: make(chan struct{})}
	const code = `{"code":"print(1)"}`
	r := httptest.NewRequest("POST", "/execute", &serverBody{data: strings.NewReader(code), answered: w.answered})
	r.ContentLength = int64(len(code))
	r.Host = "3000-web.localhost"
	r.Header.Set("Authorization", "Bearer avm_admin")
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Errorf("the relay aborted the answer: %v", v)
			}
		}()
		p.ServeHTTP(w, r)
	}()
	got := w.Body.String()
	if w.Code != 200 || strings.Count(got, "\n") != lines+1 || !strings.HasSuffix(got, "{\"end\":true}\n") {
		t.Fatalf("status %d, the answer arrived cut (%d of %d lines):\n%s", w.Code, strings.Count(got, "\n"), lines+1, got)
	}
}

func TestBoundBody(t *testing.T) {
	r := httptest.NewRequest("POST", "/", &serverBody{data: strings.NewReader("abc"), answered: closedChan()})
	r.ContentLength = 3
	BoundBody(r)
	b, err := io.ReadAll(r.Body)
	if err != nil || string(b) != "abc" {
		t.Fatalf("%q %v", b, err)
	}
	if n, err := r.Body.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("a read past the end: %d %v", n, err)
	}
	// no length, or none declared: untouched
	r = httptest.NewRequest("POST", "/", strings.NewReader("x"))
	r.ContentLength = -1
	body := r.Body
	BoundBody(r)
	if r.Body != body {
		t.Fatal("a chunked body was wrapped")
	}
}

func closedChan() chan struct{} { c := make(chan struct{}); close(c); return c }
