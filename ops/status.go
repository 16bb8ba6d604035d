package ops

import (
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// StatusJSON is the JSON shape of a table's status that `outbox status
// --json` and the console's API share; each puts the table's name beside
// it in its own way.
type StatusJSON struct {
	Backlog                     int64   `json:"backlog"`
	OldestUnpublishedAgeSeconds float64 `json:"oldest_unpublished_age_seconds"`
	// BacklogExact is false when events may wait in a log-tailing slot's
	// WAL that the backlog does not count (message and insert+delete
	// mode: it counts what the streamer decoded; docs/cdc.md).
	BacklogExact bool `json:"backlog_exact"`
	// OldestAgeEstimated says the oldest age was taken from a stale
	// record of a slot's streamer; omitted when false.
	OldestAgeEstimated bool `json:"oldest_unpublished_age_estimated,omitempty"`
	// WALBytesPending is the WAL past the confirmed LSN of the table's
	// replication slots (the events not decoded yet are in it); omitted
	// when it is polled.
	WALBytesPending *int64 `json:"wal_bytes_pending,omitempty"`
	// OldestPendingCommitAt is the commit time of the oldest transaction
	// a slot's streamer decoded and has not published (not a row of the
	// table); omitted when none.
	OldestPendingCommitAt *time.Time `json:"oldest_pending_commit_at,omitempty"`
	DeadLetters           int64      `json:"dead_letters"`
	PublishedKept         int64      `json:"published_kept"`
	HeldAggregates        int64      `json:"held_aggregates"`
	OldestHeldAgeSeconds  float64    `json:"oldest_held_age_seconds"`
	ParkedEvents          int64      `json:"parked_events"`
	DelayedEvents         int64      `json:"delayed_events"`
	SchemaVersion         int        `json:"schema_version"`
	LatestSchemaVersion   int        `json:"latest_schema_version"`
	// RelaysFrom is the oldest relay schema version the table works with
	// (0: every relay; docs/operations.md, Upgrades).
	RelaysFrom int             `json:"relays_from"`
	Partitions []PartitionJSON `json:"partitions"`
	// Pauses lists the pauses in force, oldest first.
	Pauses []outboxdriver.Pause `json:"pauses"`
	// Estimated names the counts above that are estimates (a large table,
	// summarised for the console without reading every row); omitted
	// when all are exact.
	Estimated map[string]bool `json:"estimated,omitempty"`
	// CDCSlots are the log-tailing replication slots of the table;
	// omitted when it is polled.
	CDCSlots []SlotJSON `json:"cdc_slots,omitempty"`
	// TimePartitions describes the table's time partitions; omitted when
	// it has none.
	TimePartitions *outboxdriver.TimePartitionStatus `json:"time_partitions,omitempty"`
	// Wakeups says who wakes an idle relay: "trigger" or "writers"
	// (PostgreSQL); omitted where relays only poll.
	Wakeups string `json:"wakeups,omitempty"`
}

// SlotJSON is one replication slot in StatusJSON.
type SlotJSON struct {
	Slot         string `json:"slot"`
	Publication  string `json:"publication"`
	Exists       bool   `json:"exists"`
	Active       bool   `json:"active"`
	LagBytes     int64  `json:"lag_bytes"`
	ConfirmedLSN string `json:"confirmed_lsn"`
	WALStatus    string `json:"wal_status"`
	Owner        string `json:"owner"`
	// WALBytesPending is the WAL past the slot's confirmed LSN.
	WALBytesPending int64 `json:"wal_bytes_pending"`
	// Backlog is what the slot's streamer last recorded; omitted when
	// none did (schema version 22).
	Backlog *SlotBacklogJSON `json:"backlog,omitempty"`
}

// SlotBacklogJSON is outboxdriver.SlotBacklog in StatusJSON.
type SlotBacklogJSON struct {
	Mode                  string     `json:"mode"`
	Events                int64      `json:"events"`
	OldestPendingCommitAt *time.Time `json:"oldest_pending_commit_at,omitempty"`
	OldestAgeSeconds      float64    `json:"oldest_age_seconds"`
	OldestAgeEstimated    bool       `json:"oldest_age_estimated,omitempty"`
	RecordedAt            time.Time  `json:"recorded_at"`
	RecordAgeSeconds      float64    `json:"record_age_seconds"`
	Stale                 bool       `json:"stale"`
}

// PartitionJSON is one partition's lease in StatusJSON.
type PartitionJSON struct {
	Partition        int     `json:"partition"`
	Owner            string  `json:"owner"`
	Epoch            int64   `json:"epoch"`
	ExpiresInSeconds float64 `json:"expires_in_seconds"`
	Backlog          int64   `json:"backlog"`
	// BacklogEstimated says Backlog is the partition's share of a sample.
	BacklogEstimated bool `json:"backlog_estimated,omitempty"`
}

// NewStatusJSON renders st; an expired lease shows 0 seconds left.
func NewStatusJSON(st outboxdriver.Status) StatusJSON {
	js := StatusJSON{
		Backlog: st.Backlog, OldestUnpublishedAgeSeconds: st.OldestUnpublishedAge.Seconds(),
		DeadLetters: st.DeadLetters, PublishedKept: st.Published, HeldAggregates: st.Held,
		OldestHeldAgeSeconds: st.OldestHeldAge.Seconds(), ParkedEvents: st.Parked, DelayedEvents: st.Delayed,
		SchemaVersion: st.SchemaVersion, LatestSchemaVersion: st.LatestSchemaVersion, RelaysFrom: st.RelaysFrom,
		Partitions:     make([]PartitionJSON, 0, len(st.Partitions)),
		Pauses:         append([]outboxdriver.Pause{}, st.Pauses...),
		TimePartitions: st.TimePartitions,
		Wakeups:        st.Wakeups,
		BacklogExact:   !st.BacklogInWAL, OldestAgeEstimated: st.OldestAgeEstimated,
	}
	for _, p := range st.Partitions {
		js.Partitions = append(js.Partitions, PartitionJSON{p.Partition, p.Owner, p.Epoch, max(p.ExpiresIn.Seconds(), 0), p.Backlog, st.Estimated.PartitionBacklog})
	}
	for k, v := range map[string]bool{"backlog": st.Estimated.Backlog, "published_kept": st.Estimated.Published,
		"dead_letters": st.Estimated.DeadLetters, "held_aggregates": st.Estimated.Held} {
		if v {
			if js.Estimated == nil {
				js.Estimated = map[string]bool{}
			}
			js.Estimated[k] = true
		}
	}
	for _, s := range st.Slots {
		sj := SlotJSON{Slot: s.Slot, Publication: s.Publication, Exists: s.Exists, Active: s.Active, LagBytes: s.LagBytes,
			ConfirmedLSN: s.ConfirmedLSN, WALStatus: s.WALStatus, Owner: s.Owner, WALBytesPending: s.UnconfirmedBytes}
		if js.WALBytesPending == nil {
			js.WALBytesPending = new(int64)
		}
		*js.WALBytesPending += s.UnconfirmedBytes
		if b := s.Backlog; b != nil {
			sj.Backlog = &SlotBacklogJSON{Mode: b.Mode, Events: b.Events, OldestAgeSeconds: b.OldestAge.Seconds(),
				OldestAgeEstimated: b.OldestEstimated, RecordedAt: b.RecordedAt, RecordAgeSeconds: b.RecordAge.Seconds(), Stale: b.Stale}
			if !b.OldestCommit.IsZero() {
				at := b.OldestCommit
				sj.Backlog.OldestPendingCommitAt = &at
				if js.OldestPendingCommitAt == nil || at.Before(*js.OldestPendingCommitAt) {
					js.OldestPendingCommitAt = &at
				}
			}
		}
		js.CDCSlots = append(js.CDCSlots, sj)
	}
	return js
}
