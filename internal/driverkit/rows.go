package driverkit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Delayed reports whether any of rows has a DeliverAt. Drivers insert such
// rows with a statement that writes the deliver_at column, and a write
// mode without a row (messages, insert+delete) refuses them with
// outboxdriver.ErrDelayedMode.
func Delayed(rows []outboxdriver.Row) bool {
	for i := range rows {
		if !rows[i].DeliverAt.IsZero() {
			return true
		}
	}
	return false
}

// DeliverAtCeil is t rounded up to a multiple of unit (the precision a
// database stores), so that an event is never due before its time.
func DeliverAtCeil(t time.Time, unit time.Duration) time.Time {
	if u := t.Truncate(unit); !u.Equal(t) {
		return u.Add(unit)
	}
	return t
}

// ParseHeaders reads a headers column (a JSON object) into a Record's
// Headers, leniently: what DecodeHeaders refuses is dropped. Sources use
// DecodeHeaders, so that the relay dead-letters such an event instead.
func ParseHeaders[T string | []byte](col T) map[string]string {
	h, _ := DecodeHeaders(col)
	return h
}

// DecodeHeaders reads a headers column into a Record's Headers. An empty
// column (SQL NULL), the JSON null and {} are no headers. Rows written by
// plain SQL may hold any JSON object: a value that is not a string is kept
// as its JSON text. A column that is not a JSON object, or a header whose
// value is null, cannot be published as the writer meant it: DecodeHeaders
// then returns the headers it could read and an error that names the
// problem (never the values). The common empty cases skip the JSON decoder.
func DecodeHeaders[T string | []byte](col T) (map[string]string, error) {
	if len(col) == 0 || string(col) == "{}" || string(col) == "null" {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(col), &m); err != nil {
		return nil, fmt.Errorf("the headers column holds %s, not a JSON object of header names to string values", jsonKind(col))
	}
	var null []string
	out := make(map[string]string, len(m))
	for k, v := range m {
		var str string
		switch {
		case string(v) == "null": // json.Unmarshal would make it ""
			null = append(null, k)
		case json.Unmarshal(v, &str) == nil:
			out[k] = str
		default:
			out[k] = string(v)
		}
	}
	if len(out) == 0 {
		out = nil
	}
	if len(null) > 0 {
		slices.Sort(null)
		return out, fmt.Errorf("the headers column gives header(s) %q the value null; give a string, or leave the header out", null)
	}
	return out, nil
}

// jsonKind names what a headers column holds, for messages that must not
// show its value.
func jsonKind[T string | []byte](col T) string {
	if !json.Valid([]byte(col)) {
		return "text that is not JSON"
	}
	switch strings.TrimSpace(string(col))[0] {
	case '[':
		return "a JSON array"
	case '"':
		return "a JSON string"
	case 't', 'f':
		return "a JSON boolean"
	default:
		return "a JSON number"
	}
}

// CheckWriteMode refuses rows a write mode cannot write: in a mode that
// keeps no row in the table (rowless: messages, insert + delete), a
// delayed event, which needs a row to wait in (outboxdriver.ErrDelayedMode).
func CheckWriteMode(rowless bool, rows []outboxdriver.Row) error {
	if rowless && Delayed(rows) {
		return outboxdriver.ErrDelayedMode
	}
	return nil
}

// DuplicateID returns the error of a write of rows into t that the
// database refused for the table's key on id (dup, as the driver reads
// the database's error), naming the id that text (the database's message
// or detail) names, or the only id of the write; err when dup is false.
func DuplicateID(err error, dup bool, text string, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if !dup {
		return err
	}
	e := &outboxdriver.DuplicateIDError{Table: t}
	for _, r := range rows {
		if strings.Contains(text, r.ID) {
			e.ID = r.ID
			return e
		}
	}
	if len(rows) == 1 {
		e.ID = rows[0].ID
		return e
	}
	for _, r := range rows {
		e.IDs = append(e.IDs, r.ID)
	}
	return e
}
