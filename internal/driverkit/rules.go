package driverkit

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
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

// SystemActor and SystemRole name the outbox itself in the audit, for
// what it does on its own: expiring a request, and carrying out an
// approved one (the people are the request's requester and approver,
// named in the rows' detail).
const (
	SystemActor = "(outbox)"
	SystemRole  = "system"
)

// CreatedAudit is the audit row of request r created by by, as every
// driver writes it with the request: it says in words what was requested
// (a repair names the dead letter it is about) and when it expires unless
// approved and carried out by then.
func CreatedAudit(r outboxdriver.Request, by outboxdriver.Acting) outboxdriver.AuditRecord {
	var p struct {
		EventID       string          `json:"event_id"`
		Payload       json.RawMessage `json:"payload"`
		Headers       json.RawMessage `json:"headers"`
		Since         time.Time       `json:"since"`
		Until         time.Time       `json:"until"`
		AggregateType string          `json:"aggregatetype"`
		AggregateID   string          `json:"aggregateid"`
		Type          string          `json:"type"`
		Destination   string          `json:"destination"`
		NewIDs        bool            `json:"new_ids"`
	}
	_ = json.Unmarshal(r.Params, &p) // Params were checked when the request was made
	var what, event string
	switch r.Kind {
	case outboxdriver.RequestRepair:
		event = p.EventID
		var change []string
		if p.Payload != nil {
			change = append(change, "a new payload")
		}
		if p.Headers != nil {
			change = append(change, "new headers")
		}
		what = "repair requested: dead letter " + p.EventID + ", " + strings.Join(change, " and ") + ", retried with the same id"
	case outboxdriver.RequestReplay:
		what = "replay requested: events published from " + p.Since.UTC().Format(time.RFC3339) + " until " + p.Until.UTC().Format(time.RFC3339)
		for _, f := range []struct{ name, v string }{{"aggregate type", p.AggregateType}, {"aggregate id", p.AggregateID},
			{"event type", p.Type}, {"destination", p.Destination}} {
			if f.v != "" {
				what += ", " + f.name + " " + strconv.Quote(f.v)
			}
		}
		if p.NewIDs {
			what += ", copies with new ids"
		} else {
			what += ", copies with the original ids"
		}
	default:
		what = r.Kind + " requested"
	}
	return outboxdriver.AuditRecord{
		Actor: by.Name, Action: "request", EventID: event,
		Detail: what + "; expires " + r.ExpiresAt.UTC().Format(time.RFC3339),
		Role:   by.Role, Reason: by.Reason, RequestID: r.ID,
	}
}

// decided says who requested r and who approved it.
func decided(r outboxdriver.Request) string {
	return "requested by " + r.Requester + ", approved by " + r.DecidedBy
}

// ExecuteAudit is the audit row of the execution of request r taken by
// executor: started, or resumed under a new epoch.
func ExecuteAudit(r outboxdriver.Request, executor string) outboxdriver.AuditRecord {
	detail := r.Kind + " started by executor " + executor
	if r.Epoch > 1 {
		detail = fmt.Sprintf("%s resumed by executor %s (epoch %d) after %d events", r.Kind, executor, r.Epoch, r.Done)
	}
	return outboxdriver.AuditRecord{Actor: SystemActor, Role: SystemRole, Action: "execute", RequestID: r.ID,
		Detail: detail + " (" + decided(r) + ")"}
}

// FinishAudit is the audit row of the end of request r's execution: done
// (state StateDone), or failed with msg.
func FinishAudit(r outboxdriver.Request, state, msg string) outboxdriver.AuditRecord {
	rec := outboxdriver.AuditRecord{Actor: SystemActor, Role: SystemRole, Action: "finish", RequestID: r.ID,
		Detail: fmt.Sprintf("%s done: %d events re-enqueued", r.Kind, r.Done)}
	if state == outboxdriver.StateFailed {
		rec.Action, rec.Detail = "fail", fmt.Sprintf("%s failed after %d events: %s", r.Kind, r.Done, msg)
	}
	return rec
}

// RepairAudit is the audit row of repair request r applied to dead letter
// id, with its before and after; RepairDoneAudit the row that ends it.
func RepairAudit(r outboxdriver.Request, id string, before, after json.RawMessage) outboxdriver.AuditRecord {
	return outboxdriver.AuditRecord{Actor: SystemActor, Role: SystemRole, Action: "repair", EventID: id, RequestID: r.ID,
		Detail: "payload and headers replaced (" + decided(r) + "); retried with the same id",
		Reason: r.Reason, Before: before, After: after}
}

// RepairDoneAudit is the audit row that ends repair request r of dead
// letter id.
func RepairDoneAudit(r outboxdriver.Request, id string) outboxdriver.AuditRecord {
	return outboxdriver.AuditRecord{Actor: SystemActor, Role: SystemRole, Action: "finish", EventID: id, RequestID: r.ID,
		Detail: "repair done: the dead letter is back in the outbox"}
}

// RepairRetry is who the retry of a repaired dead letter is audited as:
// the outbox itself, for request r.
func RepairRetry(r outboxdriver.Request) outboxdriver.Acting {
	return outboxdriver.Acting{Name: SystemActor, Role: SystemRole, Reason: "repair request " + r.ID + " (" + decided(r) + ")"}
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

// MaskAuditDetail is the detail of the audit row of a change to the
// stored masked path p, whose stored source is source.
func MaskAuditDetail(p outboxdriver.MaskPath, source string) string {
	return p.String() + ", from " + source
}
