package e2b

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The Connect protocol with its JSON codec, server side: what envd's RPCs
// travel in. A unary call is a POST of one JSON message answered by one
// JSON message; a server stream is one enveloped request answered by
// enveloped messages (a flag byte, a 4-byte big-endian length, JSON) and a
// last envelope with flag endStreamFlag that carries the error, if any.

const (
	envelopeCompressed = 0x01
	endStreamFlag      = 0x02
	// maxRequestMessage bounds a request message (envd's largest are
	// process input chunks).
	maxRequestMessage = 16 << 20
)

// rpcError is a Connect error: a code from the protocol's fixed set and a
// message.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

func rpcErr(code, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Connect error codes.
const (
	codeCanceled           = "canceled"
	codeInvalidArgument    = "invalid_argument"
	codeDeadlineExceeded   = "deadline_exceeded"
	codeNotFound           = "not_found"
	codeAlreadyExists      = "already_exists"
	codePermissionDenied   = "permission_denied"
	codeResourceExhausted  = "resource_exhausted"
	codeFailedPrecondition = "failed_precondition"
	codeUnimplemented      = "unimplemented"
	codeInternal           = "internal"
	codeUnavailable        = "unavailable"
	codeUnauthenticated    = "unauthenticated"
)

// httpStatus is the HTTP status of a unary error (the Connect spec's table).
func httpStatus(code string) int {
	switch code {
	case codeCanceled:
		return 499
	case codeInvalidArgument, codeFailedPrecondition:
		return http.StatusBadRequest
	case codeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case codeNotFound:
		return http.StatusNotFound
	case codeAlreadyExists:
		return http.StatusConflict
	case codePermissionDenied:
		return http.StatusForbidden
	case codeResourceExhausted:
		return http.StatusTooManyRequests
	case codeUnimplemented:
		return http.StatusNotImplemented
	case codeUnavailable:
		return http.StatusServiceUnavailable
	case codeUnauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

// asRPCError turns any error into a Connect error.
func asRPCError(err error) *rpcError {
	var re *rpcError
	if errors.As(err, &re) {
		return re
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return rpcErr(codeDeadlineExceeded, "the call's deadline passed")
	}
	if errors.Is(err, context.Canceled) {
		return rpcErr(codeCanceled, "the call was canceled")
	}
	return rpcErr(codeInternal, "%v", err)
}

// writeUnaryError answers a unary call with an error.
func writeUnaryError(w http.ResponseWriter, err error) {
	re := asRPCError(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus(re.Code))
	json.NewEncoder(w).Encode(re)
}

// unsupportedType answers a request in another codec than JSON (415, as the
// Connect protocol says).
func unsupportedType(w http.ResponseWriter, ct, want string) {
	w.Header().Set("Accept-Post", want)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnsupportedMediaType)
	json.NewEncoder(w).Encode(rpcErr(codeUnimplemented, "content type %q is not served: use the JSON codec (%s)", ct, want))
}

// timeout reads Connect-Timeout-Ms (0: none).
func timeout(r *http.Request) (time.Duration, error) {
	v := r.Header.Get("Connect-Timeout-Ms")
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || len(v) > 10 {
		return 0, rpcErr(codeInvalidArgument, "bad Connect-Timeout-Ms %q", v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// decodeMessage decodes one JSON message. Unknown fields are ignored, as
// protobuf JSON parsers do for newer clients.
func decodeMessage(b []byte, v any) error {
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil // an empty body is the empty message
	}
	if err := json.Unmarshal(b, v); err != nil {
		return rpcErr(codeInvalidArgument, "bad request message: %v", err)
	}
	return nil
}

func bodyReader(r *http.Request, header string) (io.Reader, error) {
	switch enc := r.Header.Get(header); enc {
	case "", "identity":
		return r.Body, nil
	case "gzip":
		return gzip.NewReader(r.Body)
	default:
		return nil, rpcErr(codeUnimplemented, "unsupported compression %q", enc)
	}
}

// unary serves a unary call: decode into req, call fn, write its answer.
func unary[Req, Resp any](w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, req *Req) (*Resp, error)) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		unsupportedType(w, ct, "application/json")
		return
	}
	ctx := r.Context()
	if d, err := timeout(r); err != nil {
		writeUnaryError(w, err)
		return
	} else if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	body, err := bodyReader(r, "Content-Encoding")
	if err != nil {
		writeUnaryError(w, err)
		return
	}
	b, err := io.ReadAll(io.LimitReader(body, maxRequestMessage+1))
	if err != nil {
		writeUnaryError(w, rpcErr(codeInvalidArgument, "read request: %v", err))
		return
	}
	if len(b) > maxRequestMessage {
		writeUnaryError(w, rpcErr(codeResourceExhausted, "request message larger than %d bytes", maxRequestMessage))
		return
	}
	var req Req
	if err := decodeMessage(b, &req); err != nil {
		writeUnaryError(w, err)
		return
	}
	resp, err := fn(ctx, &req)
	if err != nil {
		writeUnaryError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
}

// stream is the response side of a server stream.
type stream struct {
	w  http.ResponseWriter
	fl http.Flusher
	mu sync.Mutex
}

// Send writes one message.
func (s *stream) Send(msg any) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	return s.envelope(0, b)
}

func (s *stream) envelope(flag byte, b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var hdr [5]byte
	hdr[0] = flag
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(b)))
	if _, err := s.w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	if s.fl != nil {
		s.fl.Flush()
	}
	return nil
}

func (s *stream) end(err error) {
	var msg struct {
		Error    *rpcError           `json:"error,omitempty"`
		Metadata map[string][]string `json:"metadata,omitempty"`
	}
	if err != nil {
		msg.Error = asRPCError(err)
	}
	b, _ := json.Marshal(msg)
	s.envelope(endStreamFlag, b)
}

// serverStream serves a server-streaming call: decode the one request
// message into req and call fn, which sends messages until it returns; its
// error ends the stream.
func serverStream[Req any](w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, req *Req, s *stream) error) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/connect+json") {
		unsupportedType(w, ct, "application/connect+json")
		return
	}
	// From here on every answer is a 200 stream: clients read a stream's
	// errors only from its end message.
	w.Header().Set("Content-Type", "application/connect+json")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	s := &stream{w: w, fl: fl}
	ctx := r.Context()
	d, err := timeout(r)
	if err != nil {
		s.end(err)
		return
	}
	if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	er, err := newEnvelopeReader(r)
	if err != nil {
		s.end(err)
		return
	}
	msg, err := er.next()
	if err != nil {
		s.end(err)
		return
	}
	var req Req
	if err := decodeMessage(msg, &req); err != nil {
		s.end(err)
		return
	}
	if fl != nil {
		fl.Flush() // the client sees the headers before the first event
	}
	err = fn(ctx, &req, s)
	if ctx.Err() != nil && r.Context().Err() == nil && (err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		err = rpcErr(codeDeadlineExceeded, "the call's deadline (Connect-Timeout-Ms) passed")
	}
	s.end(err)
}

// envelopeReader reads the enveloped messages of a request body; a message
// with the compressed flag is gzip (Connect-Content-Encoding).
type envelopeReader struct {
	br   *bufio.Reader
	gzip bool
}

func newEnvelopeReader(r *http.Request) (*envelopeReader, error) {
	er := &envelopeReader{br: bufio.NewReader(r.Body)}
	switch enc := r.Header.Get("Connect-Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		er.gzip = true
	default:
		return nil, rpcErr(codeUnimplemented, "unsupported message compression %q", enc)
	}
	return er, nil
}

// next returns the next message, nil at the end of the body.
func (e *envelopeReader) next() ([]byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(e.br, hdr[:]); err != nil {
		if err == io.EOF {
			return nil, nil
		}
		return nil, rpcErr(codeInvalidArgument, "read request envelope: %v", err)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxRequestMessage {
		return nil, rpcErr(codeResourceExhausted, "request message larger than %d bytes", maxRequestMessage)
	}
	// Read as it arrives: a declared length is not memory to set aside.
	b, err := io.ReadAll(io.LimitReader(e.br, int64(n)))
	if err == nil && len(b) < int(n) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return nil, rpcErr(codeInvalidArgument, "read request message: %v", err)
	}
	if hdr[0]&envelopeCompressed == 0 {
		return b, nil
	}
	if !e.gzip {
		return nil, rpcErr(codeInvalidArgument, "a compressed message without Connect-Content-Encoding")
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, rpcErr(codeInvalidArgument, "bad gzip message: %v", err)
	}
	b, err = io.ReadAll(io.LimitReader(zr, maxRequestMessage+1))
	if err != nil {
		return nil, rpcErr(codeInvalidArgument, "bad gzip message: %v", err)
	}
	if len(b) > maxRequestMessage {
		return nil, rpcErr(codeResourceExhausted, "request message larger than %d bytes", maxRequestMessage)
	}
	return b, nil
}
