package driverkit

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox/outboxdriver"
)

var (
	uuidText   = regexp.MustCompile(`(?i)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	longNumber = regexp.MustCompile(`[0-9]{4,}`)
)

// ErrorClass is the class of a last error that failure groups share: the
// error with UUIDs blanked as <id> and numbers of four or more digits as
// <n>, cut to 200 characters. (The PostgreSQL driver computes the same in
// SQL.)
func ErrorClass(lastError string) string {
	c := longNumber.ReplaceAllString(uuidText.ReplaceAllString(lastError, "<id>"), "<n>")
	if utf8.RuneCountInString(c) > 200 {
		c = string([]rune(c)[:200])
	}
	return c
}

// FailureGroupKey names the failure group of an event type and an error
// class: 32 hex digits (the MD5 of the type's length in characters, ":",
// the type and the class).
func FailureGroupKey(eventType, class string) string {
	h := md5.Sum([]byte(strconv.Itoa(utf8.RuneCountInString(eventType)) + ":" + eventType + class))
	return hex.EncodeToString(h[:])
}

// CreatedAudit is the audit row of request r created by by, as every
// driver writes it with the request: a repair names the dead letter it is
// about.
func CreatedAudit(r outboxdriver.Request, by outboxdriver.Acting) outboxdriver.AuditRecord {
	var event string
	if r.Kind == outboxdriver.RequestRepair {
		var p struct {
			EventID string `json:"event_id"`
		}
		_ = json.Unmarshal(r.Params, &p) // Params were checked when the request was made
		event = p.EventID
	}
	return outboxdriver.AuditRecord{
		Actor: by.Name, Action: "request", EventID: event,
		Detail: r.Kind + " requested, expires " + r.ExpiresAt.UTC().Format(time.RFC3339) + " (the request holds what)",
		Role:   by.Role, Reason: by.Reason, RequestID: r.ID,
	}
}

// The wake-up protocol when writers, not a trigger, send the wake-up
// (PostgreSQL's WakeupsWriters, docs/relay.md): a writer acts on its view
// of whether a relay waits only until WakeViewMaxAge after it began to
// read it, and wakes relays whenever its view is older; so a relay that
// registers anew looks once more, WakeViewMaxAge and a margin later, for
// the events of writers that did not know of it yet. A writer gives up a
// read of the view after WakeViewReadTimeout.
const (
	WakeViewMaxAge      = 25 * time.Millisecond
	WakeViewReadTimeout = time.Second
)

// ResolveMigrate returns opts (nil: none) with the defaults filled in, or
// an error for a value out of bounds.
func ResolveMigrate(opts *outboxdriver.MigrateOptions) (outboxdriver.MigrateOptions, error) {
	o := outboxdriver.MigrateOptions{}
	if opts != nil {
		o = *opts
	}
	if o.Partitions == 0 {
		o.Partitions = outboxdriver.DefaultPartitions
	}
	if o.Partitions < 1 || o.Partitions > outboxdriver.MaxPartitions {
		return o, fmt.Errorf("partitions %d: use 1 to %d", o.Partitions, outboxdriver.MaxPartitions)
	}
	switch o.TimePartitions {
	case "":
		if o.TimePartitionsAhead != 0 {
			return o, fmt.Errorf("time partitions ahead %d: set only with time partitions", o.TimePartitionsAhead)
		}
	case outboxdriver.TimePartitionsDay, outboxdriver.TimePartitionsHour:
		if o.TimePartitionsAhead == 0 {
			o.TimePartitionsAhead = 7
			if o.TimePartitions == outboxdriver.TimePartitionsHour {
				o.TimePartitionsAhead = 48
			}
		}
		if o.TimePartitionsAhead < 1 || o.TimePartitionsAhead > 1000 {
			return o, fmt.Errorf("time partitions ahead %d: use 1 to 1000", o.TimePartitionsAhead)
		}
	default:
		return o, fmt.Errorf("time partitions %q: use %q or %q", o.TimePartitions, outboxdriver.TimePartitionsDay, outboxdriver.TimePartitionsHour)
	}
	switch o.Wakeups {
	case "", outboxdriver.WakeupsTrigger, outboxdriver.WakeupsWriters:
	default:
		return o, fmt.Errorf("wake-ups %q: use %q or %q", o.Wakeups, outboxdriver.WakeupsTrigger, outboxdriver.WakeupsWriters)
	}
	return o, nil
}

// ResolveMaintenance returns m with its defaults, or an error for a value
// out of bounds.
func ResolveMaintenance(m outboxdriver.TimePartitionMaintenance) (outboxdriver.TimePartitionMaintenance, error) {
	if m.Actor == "" {
		m.Actor = "outbox"
	}
	if m.LockTimeout == 0 {
		m.LockTimeout = outboxdriver.DefaultPartitionLockTimeout
	}
	if m.LockTimeout < time.Millisecond || m.LockTimeout > time.Minute {
		return m, fmt.Errorf("partition lock timeout %s: use 1ms to 1m", m.LockTimeout)
	}
	return m, nil
}
