package outboxdriver

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaskPath is one payload path stored with the table as sensitive: every
// process that shows a payload of the table (the command line, the
// console, its JSON API) masks the values at Path in the events it
// applies to. AggregateType and Type narrow it to the events of one
// aggregate type, one event type or both; empty, it applies to every
// event. The paths stored with the table are its masking
// (docs/security.md).
type MaskPath struct {
	AggregateType string `json:"aggregatetype"`
	Type          string `json:"type"`
	// Path is a dot-separated JSON path (customer.email, cards.*.number;
	// * matches any key or array index).
	Path string `json:"path"`
	// Source says where the path came from: "operator" for one added by
	// hand, "contract NAME" for one a contract names sensitive or
	// forbidden.
	Source string `json:"source"`
	// Actor and At are who stored it and when (set by the Store).
	Actor string    `json:"actor"`
	At    time.Time `json:"at"`
}

// MaskSourceOperator is MaskPath.Source of a path an operator added.
const MaskSourceOperator = "operator"

// MaxMaskText is the longest aggregate type, event type, path or source a
// MaskPath holds, in bytes.
const MaxMaskText = 255

// Scope is the text form of the events p applies to: "all",
// "aggregatetype=A", "type=E" or "aggregatetype=A type=E".
func (p MaskPath) Scope() string {
	var parts []string
	if p.AggregateType != "" {
		parts = append(parts, "aggregatetype="+p.AggregateType)
	}
	if p.Type != "" {
		parts = append(parts, "type="+p.Type)
	}
	if len(parts) == 0 {
		return "all"
	}
	return strings.Join(parts, " ")
}

// String is p as its audit rows name it: the path and its scope.
func (p MaskPath) String() string { return p.Path + " (" + p.Scope() + ")" }

// Applies reports whether p applies to the events of aggregateType and
// eventType.
func (p MaskPath) Applies(aggregateType, eventType string) bool {
	return (p.AggregateType == "" || p.AggregateType == aggregateType) && (p.Type == "" || p.Type == eventType)
}

// Validate reports why p cannot be stored, or nil: each text at most
// MaxMaskText bytes of UTF-8 without control characters, the path made of
// non-empty segments separated by single dots, and a source.
func (p MaskPath) Validate() error {
	for _, f := range []struct{ name, v string }{{"aggregate type", p.AggregateType}, {"event type", p.Type}, {"path", p.Path}, {"source", p.Source}} {
		if len(f.v) > MaxMaskText || !utf8.ValidString(f.v) || strings.ContainsFunc(f.v, unicode.IsControl) {
			return fmt.Errorf("masked path: the %s must be at most %d bytes of text without control characters", f.name, MaxMaskText)
		}
	}
	if p.Source == "" {
		return fmt.Errorf("masked path %q: no source (%q, or the contract that names it)", p.Path, MaskSourceOperator)
	}
	if p.Path == "" || strings.HasPrefix(p.Path, ".") || strings.HasSuffix(p.Path, ".") || strings.Contains(p.Path, "..") {
		return fmt.Errorf("masked path %q: write segments separated by single dots, e.g. customer.email or cards.*.number", p.Path)
	}
	return nil
}
