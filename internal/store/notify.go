package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
)

// Cluster nodes tell each other of changes through PostgreSQL's
// LISTEN/NOTIFY: Notify sends on a channel, Listen hears it on every node
// (the sender's too). A notification sent while a node is not listening
// is lost to it: Listen's caller catches up from the tables (onListen).

// NotifyChannel is the channel of agentvm's notifications.
const NotifyChannel = "agentvm"

// Notify sends msg to every node listening (at the commit of the
// statement, at once here).
func (s *Store) Notify(ctx context.Context, msg string) error {
	if err := s.needCluster(); err != nil {
		return err
	}
	if badText([]any{msg}) || len(msg) > 7000 {
		return fmt.Errorf("notification: %w or longer than 7000 bytes", ErrBadText)
	}
	_, err := s.exec(ctx, `SELECT pg_notify(?, ?)`, NotifyChannel, msg)
	return err
}

// listenIdle is how long Listen waits for a message before it checks its
// connection (a ping: a connection dropped without a word, by a firewall
// or a failover, would otherwise wait for ever) and calls idle.
var listenIdle = 30 * time.Second

// Listen holds a connection of its own that listens on NotifyChannel,
// calls onListen once it does (to catch up on what was missed before),
// then heard with each message and idle after each listenIdle without
// one (to catch up on a message lost in sending), until ctx ends or the
// connection fails (its error is returned; the caller listens again).
func (s *Store) Listen(ctx context.Context, onListen, idle func(), heard func(msg string)) error {
	if err := s.needCluster(); err != nil {
		return err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	// The connection had a session-level LISTEN: it must not go back to
	// the pool, whatever happens (ErrBadConn makes Close discard it).
	defer func() {
		conn.Raw(func(any) error { return driver.ErrBadConn })
		conn.Close()
	}()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("listen: not a pgx connection (%T)", dc)
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, `LISTEN `+NotifyChannel); err != nil {
			return err
		}
		// The read cache serves while a Listen listens (cache.go).
		s.cache.listen(1)
		defer s.cache.listen(-1)
		if onListen != nil {
			onListen()
		}
		for {
			wctx, cancel := context.WithTimeout(ctx, listenIdle)
			n, err := pc.WaitForNotification(wctx)
			cancel()
			switch {
			case err == nil && n.Payload == cacheNotice:
				s.cache.changed()
				continue
			case err == nil:
				heard(n.Payload)
				continue
			case ctx.Err() != nil:
				return ctx.Err()
			case !errors.Is(err, context.DeadlineExceeded):
				return err
			}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = pc.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("listen: the connection does not answer: %w", err)
			}
			s.cache.changed() // belt and braces: the triggers' notices are not lost while it listens
			if idle != nil {
				idle()
			}
		}
	})
}
