package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
)

// Event is an asynchronous QMP event.
type Event struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

// QMP is one persistent QMP connection. Commands may be issued concurrently;
// events are delivered to the handler given at dial time, in order.
type QMP struct {
	conn    net.Conn
	mu      sync.Mutex // serialises writes and the pending map
	nextID  uint64
	pending map[string]chan qmpReply
	done    chan struct{}
	err     error
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	ID    string          `json:"id"`
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

// QMPError is an error returned by QEMU for a command.
type QMPError struct{ Class, Desc string }

func (e *QMPError) Error() string { return fmt.Sprintf("qmp: %s: %s", e.Class, e.Desc) }

// DialQMP connects to a QMP unix socket, retrying until ctx is done (QEMU may not
// have created it yet), negotiates capabilities and starts the reader.
func DialQMP(ctx context.Context, path string, onEvent func(Event)) (*QMP, error) {
	var conn net.Conn
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			conn = c
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial qmp %s: %w", path, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	q := &QMP{conn: conn, pending: map[string]chan qmpReply{}, done: make(chan struct{})}
	r := bufio.NewReaderSize(conn, 64<<10)
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	}
	if _, err := r.ReadBytes('\n'); err != nil { // greeting
		conn.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	conn.SetReadDeadline(time.Time{})
	go q.readLoop(r, onEvent)
	if _, err := q.Execute(ctx, "qmp_capabilities", nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

func (q *QMP) readLoop(r *bufio.Reader, onEvent func(Event)) {
	var err error
	for {
		var line []byte
		line, err = r.ReadBytes('\n')
		if err != nil {
			break
		}
		var m qmpReply
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		if m.Event != "" {
			if onEvent != nil {
				onEvent(Event{Event: m.Event, Data: m.Data})
			}
			continue
		}
		q.mu.Lock()
		ch := q.pending[m.ID]
		delete(q.pending, m.ID)
		q.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
	q.mu.Lock()
	q.err = fmt.Errorf("qmp connection closed: %w", err)
	for id, ch := range q.pending {
		close(ch)
		delete(q.pending, id)
	}
	q.mu.Unlock()
	close(q.done)
}

// Done is closed when the connection ends (normally because QEMU exited).
func (q *QMP) Done() <-chan struct{} { return q.done }

// Execute runs one command and returns its "return" value.
func (q *QMP) Execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	return q.execute(ctx, cmd, args, -1)
}

// ExecuteWithFD runs a command carrying a file descriptor (SCM_RIGHTS), as `getfd` needs.
func (q *QMP) ExecuteWithFD(ctx context.Context, cmd string, args any, fd int) (json.RawMessage, error) {
	return q.execute(ctx, cmd, args, fd)
}

func (q *QMP) execute(ctx context.Context, cmd string, args any, fd int) (json.RawMessage, error) {
	ch := make(chan qmpReply, 1)
	q.mu.Lock()
	if q.err != nil {
		err := q.err
		q.mu.Unlock()
		return nil, err
	}
	q.nextID++
	id := fmt.Sprint(q.nextID)
	q.pending[id] = ch
	msg := map[string]any{"execute": cmd, "id": id}
	if args != nil {
		msg["arguments"] = args
	}
	b, _ := json.Marshal(msg)
	var err error
	if uc, ok := q.conn.(*net.UnixConn); ok && fd >= 0 {
		_, _, err = uc.WriteMsgUnix(append(b, '\n'), syscall.UnixRights(fd), nil)
	} else if fd >= 0 {
		err = fmt.Errorf("cannot pass a file descriptor over %T", q.conn)
	} else {
		_, err = q.conn.Write(append(b, '\n'))
	}
	if err != nil {
		delete(q.pending, id)
	}
	q.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("qmp %s: connection closed", cmd)
		}
		if m.Error != nil {
			return nil, &QMPError{Class: m.Error.Class, Desc: m.Error.Desc}
		}
		return m.Return, nil
	case <-ctx.Done():
		q.mu.Lock()
		delete(q.pending, id)
		q.mu.Unlock()
		return nil, fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

// Close closes the connection.
func (q *QMP) Close() error {
	err := q.conn.Close()
	<-q.done
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
