package outboxdriver

import (
	"fmt"
	"strings"
	"time"
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

// FailureGroup is the dead letters of one event type that failed with the
// same class of error: the last error with ids and long numbers blanked,
// as NServiceBus ServicePulse groups failed messages.
type FailureGroup struct {
	// Key names the group in Store.FailureGroupIDs.
	Key        string    `json:"key"`
	Type       string    `json:"type"`
	ErrorClass string    `json:"error_class"`
	Count      int64     `json:"count"`
	First      time.Time `json:"first"`
	Last       time.Time `json:"last"`
	// Example is the id of the group's oldest dead letter.
	Example string `json:"example"`
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
	// SchemaVersion is the newest schema version the relay's code knows;
	// 0 when unknown: a relay of a release before schema version 20
	// (PostgreSQL; MySQL/MariaDB 6, SQLite 4), or on a table before it,
	// records none, and counts as older than any version.
	SchemaVersion int `json:"schema_version"`
	// Release is the release of the relay's code (its module version), ""
	// when unknown.
	Release string `json:"release"`
	// RenewedAt is when the relay last renewed its registration (database
	// clock); zero when unknown (a table before those versions).
	RenewedAt time.Time `json:"renewed_at"`
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
	// Discarded counts the dead letters discarded after the previous
	// sample listed and up to this one, by the audit's discard rows (0 for
	// the first sample listed): a discard lowers DeadLetters without a
	// publish.
	Discarded int64 `json:"discarded"`
}
