package outboxdriver

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// PauseKind is what a pause stops.
type PauseKind string

// The kinds of pause.
const (
	// PauseAll stops every event of the table.
	PauseAll PauseKind = "all"
	// PauseDestination stops the events routed to one destination.
	PauseDestination PauseKind = "destination"
	// PauseAggregateType stops the events of one aggregate type.
	PauseAggregateType PauseKind = "aggregatetype"
)

// PauseScope is one scope a pause stops: Kind, and the destination or
// aggregate type it names (empty for PauseAll).
type PauseScope struct {
	Kind  PauseKind `json:"scope"`
	Value string    `json:"value,omitempty"`
}

// String is the scope's text form, which ParsePauseScope reads: "all",
// "destination=X" or "aggregatetype=Y".
func (s PauseScope) String() string {
	if s.Kind == PauseAll {
		return string(PauseAll)
	}
	return string(s.Kind) + "=" + s.Value
}

// ParsePauseScope reads "all", "destination=X" or "aggregatetype=Y".
func ParsePauseScope(s string) (PauseScope, error) {
	if s == string(PauseAll) {
		return PauseScope{Kind: PauseAll}, nil
	}
	k, v, ok := strings.Cut(s, "=")
	sc := PauseScope{Kind: PauseKind(k), Value: v}
	if !ok || (sc.Kind != PauseDestination && sc.Kind != PauseAggregateType) {
		return PauseScope{}, fmt.Errorf("pause scope %q: use all, destination=NAME or aggregatetype=NAME", s)
	}
	return sc, sc.Validate()
}

// Validate reports why s cannot be paused, or nil.
func (s PauseScope) Validate() error {
	switch s.Kind {
	case PauseAll:
		if s.Value != "" {
			return fmt.Errorf("pause scope all takes no value (got %q)", s.Value)
		}
		return nil
	case PauseDestination, PauseAggregateType:
		if strings.TrimSpace(s.Value) == "" || len(s.Value) > 255 || strings.ContainsAny(s.Value, "\x00\r\n") {
			return fmt.Errorf("pause scope %s: name one %s of at most 255 bytes, without line breaks", s.Kind, s.Kind)
		}
		return nil
	}
	return fmt.Errorf("pause scope %q: use all, destination or aggregatetype", s.Kind)
}

// Pause is one pause in force.
type Pause struct {
	PauseScope
	// Actor, Role and Reason are who paused, under which role, and why.
	Actor  string    `json:"actor"`
	Role   string    `json:"role"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// Pauses is the set of pauses in force, as a relay consults it.
type Pauses struct {
	All            bool
	Destinations   map[string]bool
	AggregateTypes map[string]bool
}

// NewPauses returns the set of ps.
func NewPauses(ps []Pause) Pauses {
	var s Pauses
	for _, p := range ps {
		switch p.Kind {
		case PauseAll:
			s.All = true
		case PauseDestination:
			if s.Destinations == nil {
				s.Destinations = map[string]bool{}
			}
			s.Destinations[p.Value] = true
		case PauseAggregateType:
			if s.AggregateTypes == nil {
				s.AggregateTypes = map[string]bool{}
			}
			s.AggregateTypes[p.Value] = true
		}
	}
	return s
}

// Empty reports whether nothing is paused.
func (s Pauses) Empty() bool {
	return !s.All && len(s.Destinations) == 0 && len(s.AggregateTypes) == 0
}

// Stops reports whether an event of aggregateType routed to destination
// is paused.
func (s Pauses) Stops(aggregateType, destination string) bool {
	return s.All || s.AggregateTypes[aggregateType] || s.Destinations[destination]
}

// PauseReader is a Source whose relay honours pauses: it reads the pauses
// in force (one small query). A Batch that holds a connection while its
// records are published should be one too, reading on that connection:
// the relay reads the pauses again before it publishes, and must not wait
// for a second connection of a pool its other batches may hold whole.
type PauseReader interface {
	Pauses(ctx context.Context) ([]Pause, error)
}

// ClaimExcluder is a Source that can leave whole aggregate types out of
// its claims, so that a paused type's backlog does not fill every batch
// while other types wait behind it. The relay sets the types it knows to
// be paused before it claims; nil excludes none.
type ClaimExcluder interface {
	ExcludeAggregateTypes(types []string)
}

// HeldAggregate is an aggregate whose later events wait behind one of its
// events.
type HeldAggregate struct {
	AggregateType string `json:"aggregatetype"`
	AggregateID   string `json:"aggregateid"`
	// EventID is the event it waits behind; Reason is "dead-lettered"
	// (EventID is a dead letter) or "retrying" (it is in the outbox,
	// waiting for its next attempt).
	EventID string    `json:"event_id"`
	Reason  string    `json:"reason"`
	Since   time.Time `json:"since"`
	// Waiting counts the aggregate's events that wait behind it; -1 when
	// not counted (a driver may leave it uncounted when that would read a
	// large backlog whole).
	Waiting int64 `json:"waiting"`
	// LastError is the event's last error.
	LastError string `json:"last_error"`
}

// Controller is a Store that keeps pauses and answers for held
// aggregates. Every change is written to the audit table in the same
// transaction, with by's name, role and reason.
type Controller interface {
	// ListPauses lists the pauses in force on t, oldest first.
	ListPauses(ctx context.Context, t Table) ([]Pause, error)
	// SetPause pauses s; it reports false when s was paused already
	// (nothing is changed then).
	SetPause(ctx context.Context, t Table, s PauseScope, by Acting) (bool, error)
	// LiftPause resumes s; it reports false when s was not paused.
	LiftPause(ctx context.Context, t Table, s PauseScope, by Acting) (bool, error)
	// HeldAggregates lists up to limit held aggregates, longest held
	// first.
	HeldAggregates(ctx context.Context, t Table, limit int) ([]HeldAggregate, error)
	// ReleaseHeld lets the later events of the aggregate held behind the
	// dead letter eventID flow on (the dead letter stays); it wraps
	// ErrNotFound when that dead letter holds no aggregate.
	ReleaseHeld(ctx context.Context, t Table, eventID string, by Acting) (HeldAggregate, error)
}

// FailureGroup is the dead letters of one event type that failed with the
// same class of error: the last error with ids and long numbers blanked,
// as NServiceBus ServicePulse groups failed messages.
type FailureGroup struct {
	// Key names the group in FailureGroupIDs.
	Key        string    `json:"key"`
	Type       string    `json:"type"`
	ErrorClass string    `json:"error_class"`
	Count      int64     `json:"count"`
	First      time.Time `json:"first"`
	Last       time.Time `json:"last"`
	// Example is the id of the group's oldest dead letter.
	Example string `json:"example"`
}

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

// FailureGrouper is a Store that groups dead letters by event type and
// error class.
type FailureGrouper interface {
	// FailureGroups lists up to limit groups of t, largest first.
	FailureGroups(ctx context.Context, t Table, limit int) ([]FailureGroup, error)
	// FailureGroupIDs returns the ids of up to limit dead letters of the
	// group key, oldest first (none for a key no group has).
	FailureGroupIDs(ctx context.Context, t Table, key string, limit int) ([]string, error)
}

// KindBacklog is the unpublished events of one aggregate type and event
// type.
type KindBacklog struct {
	AggregateType string        `json:"aggregatetype"`
	Type          string        `json:"type"`
	Backlog       int64         `json:"backlog"`
	OldestAge     time.Duration `json:"-"`
	// Estimated says that Backlog is an estimate from a sample of the
	// table, and OldestAge may be (exact for a kind among the oldest
	// events).
	Estimated bool `json:"estimated"`
}

// RelayStatus is one relay in the registry.
type RelayStatus struct {
	Name    string    `json:"name"`
	Started time.Time `json:"started"`
	// ExpiresIn is how long its registration still runs without a
	// heartbeat (negative: it is gone).
	ExpiresIn time.Duration `json:"-"`
}

// Sample is one of the console's samples of a table.
type Sample struct {
	At          time.Time `json:"at"`
	Backlog     int64     `json:"backlog"`
	OldestAge   float64   `json:"oldest_age_seconds"`
	DeadLetters int64     `json:"dead_letters"`
	// LastSeq is the highest position handed out: inserts between two
	// samples are the difference.
	LastSeq int64 `json:"last_seq"`
}

// Observer is a Store that answers the console's overview beyond Status:
// the backlog by kind, the relays, and samples over time.
type Observer interface {
	// Backlog lists up to limit groups of unpublished events, largest
	// first; above a bound of events the counts are estimates
	// (KindBacklog.Estimated).
	Backlog(ctx context.Context, t Table, limit int) ([]KindBacklog, error)
	// Relays lists the registered relays.
	Relays(ctx context.Context, t Table) ([]RelayStatus, error)
	// RecordSample stores a sample of t now and deletes samples older
	// than keep.
	RecordSample(ctx context.Context, t Table, keep time.Duration) error
	// Samples lists the samples since a time, oldest first.
	Samples(ctx context.Context, t Table, since time.Time) ([]Sample, error)
}
