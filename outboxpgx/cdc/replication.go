package cdc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/outboxkit/outbox/outboxdriver"
)

// replConfig is the configuration of a replication connection.
func (s *Source) replConfig() *pgconn.Config {
	cfg := s.pool.Config().ConnConfig.Config.Copy()
	cfg.RuntimeParams["replication"] = "database"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "outbox"
	}
	// The text forms the decoder reads.
	cfg.RuntimeParams["datestyle"] = "ISO"
	cfg.RuntimeParams["timezone"] = "UTC"
	cfg.RuntimeParams["bytea_output"] = "hex"
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	return cfg
}

// replConnError says what to do when a replication connection is refused
// for want of the REPLICATION attribute.
func replConnError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("log tailing needs a role with the REPLICATION attribute: run ALTER ROLE <the relay's role> REPLICATION (%s)", pgErr.Message)
	}
	return fmt.Errorf("open the replication connection: %w", err)
}

// connect opens the replication connection and starts streaming from the
// slot's confirmed LSN. A stale streamer still connected to the slot (its
// lease expired, and this relay holds it now) is terminated first.
func (st *stream) connect(ctx context.Context, streaming bool) (*pgconn.PgConn, error) {
	s := st.src
	conn, err := pgconn.ConnectConfig(ctx, s.replConfig())
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", replConnError(err))
	}
	// Only under the lease: a relay whose lease expired must not stop the
	// new owner's stream.
	if err := st.fenced(ctx, slotOwned); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	if err := st.takeOver(ctx); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	// From the LSN recorded with the last batch's outcome: the slot's own
	// confirmed LSN may lag it (the relay stopped or died before it sent
	// it), and what is recorded is done; the server starts from the later
	// of the two.
	var from string
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(confirmed_lsn, '0/0')::text FROM `+s.cn.State+` WHERE slot = $1`, s.cfg.Slot).Scan(&from); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("outboxpgx: read the state of slot %s: %w", s.cfg.Slot, err)
	}
	start, err := pglogrepl.ParseLSN(from)
	if err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("outboxpgx: slot %s: confirmed_lsn %q: %w", s.cfg.Slot, from, err)
	}
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{
			"proto_version '2'",
			"streaming '" + strconv.FormatBool(streaming) + "'",
			"publication_names '" + outboxdriver.QuoteIdent(s.cfg.Publication) + "'",
			"messages 'true'",
		},
	})
	if err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("outboxpgx: start streaming slot %s: %w", s.cfg.Slot, slotError(err, s.cfg.Slot))
	}
	return conn, nil
}

// takeOver terminates the process still streaming the slot, if any: this
// relay holds the lease, so that one is a stale streamer (or a stranger),
// and it must not confirm anything any more. It waits until the slot is
// free.
func (st *stream) takeOver(ctx context.Context) error {
	s := st.src
	deadline := time.Now().Add(10 * time.Second)
	for warned := false; ; {
		var pid int32
		err := s.pool.QueryRow(ctx, `SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1`, s.cfg.Slot).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && pid == 0) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("outboxpgx: look up replication slot %s: %w", s.cfg.Slot, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("outboxpgx: replication slot %s is busy: process %d streams from it and could not be stopped", s.cfg.Slot, pid)
		}
		if !warned {
			s.base.Log.Warn("outboxpgx: replication slot is streamed by another process; this relay holds its lease and stops it", "slot", s.cfg.Slot, "pid", pid)
			warned = true
			if _, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				return fmt.Errorf("outboxpgx: replication slot %s is busy: process %d streams from it: %w", s.cfg.Slot, pid, err)
			}
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}
