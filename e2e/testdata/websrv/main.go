// Command websrv is the web server the preview tests run inside a VM: plain
// pages, header echo, upload checksums, server-sent events and a WebSocket
// echo. Built static by the test and copied in through the files API.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/coder/websocket"
)

func main() {
	addr := ":8000"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s %s\n", r.Proto, r.URL.Path)
	})
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]string{
			"host": r.Host, "xff": r.Header.Get("X-Forwarded-For"), "xfh": r.Header.Get("X-Forwarded-Host"),
			"xfp": r.Header.Get("X-Forwarded-Proto"), "authorization": r.Header.Get("Authorization"),
			"cookie": r.Header.Get("Cookie"), "proto": r.Proto,
		})
	})
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		fmt.Fprintf(w, "%d %s\n", n, hex.EncodeToString(h.Sum(nil)))
	})
	// /events?id=X sends its first event, then the rest once /events/go?id=X
	// was asked (a client that gets the first event before it asks shows
	// that the stream was not held back), or "timeout" after two minutes.
	var mu sync.Mutex
	release := map[string]chan struct{}{}
	gate := func(id string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if release[id] == nil {
			release[id] = make(chan struct{})
		}
		return release[id]
	}
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		fl := w.(http.Flusher)
		fmt.Fprint(w, "data: event-1\n\n")
		fl.Flush()
		select {
		case <-gate(r.URL.Query().Get("id")):
		case <-time.After(2 * time.Minute):
			fmt.Fprint(w, "data: timeout\n\n")
			return
		}
		for i := 2; i <= 5; i++ {
			fmt.Fprintf(w, "data: event-%d\n\n", i)
			fl.Flush()
		}
	})
	mux.HandleFunc("/events/go", func(w http.ResponseWriter, r *http.Request) {
		ch := gate(r.URL.Query().Get("id"))
		mu.Lock()
		select {
		case <-ch:
		default:
			close(ch)
		}
		mu.Unlock()
		fmt.Fprintln(w, "released")
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, append([]byte("echo:"), b...)); err != nil {
				return
			}
		}
	})
	prot := new(http.Protocols)
	prot.SetHTTP1(true)
	prot.SetUnencryptedHTTP2(true)
	srv := &http.Server{Addr: addr, Handler: mux, Protocols: prot}
	log.Fatal(srv.ListenAndServe())
}
