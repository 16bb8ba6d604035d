// Package route turns an outbox record into a broker message the way
// Debezium's Outbox Event Router does, so consumers built for Debezium work
// unchanged: destination "outbox.event.<aggregatetype>", key = aggregateid,
// header "id" = event id, value = payload.
package route

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/sink"
)

// Defaults, as in Debezium's Outbox Event Router.
const (
	DefaultRouteBy     = "aggregatetype"
	DefaultRegex       = `(?P<routedByValue>.*)`
	DefaultReplacement = "outbox.event.${routedByValue}"
)

// Columns that can route or be placed into headers.
var columns = map[string]func(*outboxdriver.Record) string{
	"aggregatetype": func(r *outboxdriver.Record) string { return r.AggregateType },
	"aggregateid":   func(r *outboxdriver.Record) string { return r.AggregateID },
	"type":          func(r *outboxdriver.Record) string { return r.Type },
	"id":            func(r *outboxdriver.Record) string { return r.ID },
	"created_at": func(r *outboxdriver.Record) string {
		return r.CreatedAt.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
	},
}

// ColumnNames lists the columns RouteBy and HeaderColumns accept.
func ColumnNames() []string {
	return []string{"aggregatetype", "aggregateid", "type", "id", "created_at"}
}

// Config configures a Router. The zero value is Debezium's default routing.
type Config struct {
	// RouteBy names the column whose value picks the destination
	// (Debezium's route.by.field). Defaults to "aggregatetype".
	RouteBy string
	// Regex must match the whole routed value; its named groups can be used
	// in Replacement (Debezium's route.topic.regex). Defaults to
	// "(?P<routedByValue>.*)".
	Regex string
	// Replacement builds the destination; ${name} expands a group of Regex
	// (Debezium's route.topic.replacement). Defaults to
	// "outbox.event.${routedByValue}".
	Replacement string
	// HeaderColumns places more columns into headers, each as "column" or
	// "column:header-name" (Debezium's table.fields.additional.placement
	// with placement header). For example "type:eventType".
	HeaderColumns []string
	// Destination, when set, sends every event there (one topic, subject
	// or queue for the whole table), and RouteBy, Regex and Replacement
	// must be left empty.
	Destination string
	// CloudEvents, when set, makes every message a CloudEvent 1.0 in
	// binary or structured mode (docs/relay.md#cloudevents).
	CloudEvents *CloudEvents
}

type headerColumn struct {
	get  func(*outboxdriver.Record) string
	name string
}

// Router maps records to messages. It is safe for concurrent use.
type Router struct {
	by          func(*outboxdriver.Record) string
	byName      string
	re          *regexp.Regexp
	replacement string
	headers     []headerColumn
	ce          *CloudEvents

	cache  sync.Map // routed value -> destination
	cached atomic.Int64
}

// New validates cfg and returns a Router.
func New(cfg *Config) (*Router, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Destination != "" && (c.RouteBy != "" || c.Regex != "" || c.Replacement != "") {
		return nil, fmt.Errorf("route: a fixed destination %q takes no route-by column, regex or replacement", c.Destination)
	}
	if c.Destination != "" {
		// The routed value is then the destination itself.
		c.Regex, c.Replacement = `.*`, strings.ReplaceAll(c.Destination, "$", "$$")
	}
	if c.RouteBy == "" {
		c.RouteBy = DefaultRouteBy
	}
	if c.Regex == "" {
		c.Regex = DefaultRegex
	}
	if c.Replacement == "" {
		c.Replacement = DefaultReplacement
	}
	by, ok := columns[c.RouteBy]
	if !ok {
		return nil, fmt.Errorf("route: cannot route by %q: use one of %s", c.RouteBy, strings.Join(ColumnNames(), ", "))
	}
	re, err := regexp.Compile(`^(?:` + c.Regex + `)$`)
	if err != nil {
		return nil, fmt.Errorf("route: regex %q: %w", c.Regex, err)
	}
	r := &Router{by: by, byName: c.RouteBy, re: re, replacement: c.Replacement}
	if c.CloudEvents != nil {
		ce := *c.CloudEvents
		if err := ce.check(); err != nil {
			return nil, err
		}
		r.ce = &ce
	}
	for _, spec := range c.HeaderColumns {
		col, name, _ := strings.Cut(strings.TrimSpace(spec), ":")
		if name == "" {
			name = col
		}
		get, ok := columns[col]
		if !ok {
			return nil, fmt.Errorf("route: header column %q: use one of %s", col, strings.Join(ColumnNames(), ", "))
		}
		if name == "id" {
			return nil, fmt.Errorf("route: header column %q: the header \"id\" always carries the event id", spec)
		}
		r.headers = append(r.headers, headerColumn{get: get, name: name})
	}
	return r, nil
}

// RouteBy names the column whose value picks the destination.
func (r *Router) RouteBy() string { return r.byName }

// Destination returns the destination of rec.
func (r *Router) Destination(rec *outboxdriver.Record) (string, error) {
	return r.DestinationOf(r.by(rec))
}

// DestinationOf returns the destination of an event whose RouteBy column
// holds v.
func (r *Router) DestinationOf(v string) (string, error) {
	// Routed values repeat (an aggregate type, say): remember what the
	// regex made of the last few rather than run it for every event.
	if d, ok := r.cache.Load(v); ok {
		return d.(string), nil
	}
	m := r.re.FindStringSubmatchIndex(v)
	if m == nil {
		return "", fmt.Errorf("route: %s %q does not match %s", r.byName, v, r.re)
	}
	d := string(r.re.ExpandString(nil, r.replacement, v, m))
	if r.cached.Load() < maxCached {
		if _, loaded := r.cache.LoadOrStore(v, d); !loaded {
			r.cached.Add(1)
		}
	}
	return d, nil
}

// ByAggregateType reports whether the destination depends on the
// aggregate type alone (the default routing, and a fixed destination).
func (r *Router) ByAggregateType() bool { return r.byName == DefaultRouteBy }

// maxCached bounds the remembered destinations: routing by a column with
// many values (the aggregate id) must not grow memory without end.
const maxCached = 4096

// Message maps rec to a message: the routed destination, key = aggregate
// id, value = payload, headers "id", the event's own headers (sorted by
// name), "traceparent"/"tracestate" from the stored trace context, then the
// configured header columns.
//
// A record that cannot become the message its writer meant is an error,
// which the relay dead-letters without retrying: an aggregate id that
// cannot be the key unchanged (outboxdriver.CheckAggregateID), or a
// headers column that could not be read (Record.HeadersErr).
func (r *Router) Message(rec *outboxdriver.Record) (sink.Message, error) {
	if err := outboxdriver.CheckAggregateID(rec.AggregateID); err != nil {
		return sink.Message{}, fmt.Errorf("route: event %s: %w: the message key must equal the aggregate id", rec.ID, err)
	}
	if rec.HeadersErr != nil {
		return sink.Message{}, fmt.Errorf("route: event %s: %w", rec.ID, rec.HeadersErr)
	}
	dest, err := r.Destination(rec)
	if err != nil {
		return sink.Message{}, err
	}
	m := sink.Message{
		ID:          rec.ID,
		Destination: dest,
		Key:         []byte(rec.AggregateID),
		Type:        rec.Type,
		Value:       rec.Payload,
		Headers:     make([]sink.Header, 0, 1+len(rec.Headers)+len(r.headers)+2),
	}
	m.Headers = append(m.Headers, sink.Header{Key: "id", Value: rec.ID})
	if len(rec.Headers) > 0 {
		for _, k := range slices.Sorted(maps.Keys(rec.Headers)) {
			if k == "id" {
				continue // the event id wins
			}
			m.Headers = append(m.Headers, sink.Header{Key: k, Value: rec.Headers[k]})
		}
	}
	for line := range strings.SplitSeq(rec.TraceContext, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok && (k == "traceparent" || k == "tracestate") && v != "" {
			m.Headers = append(m.Headers, sink.Header{Key: k, Value: v})
		}
	}
	for _, h := range r.headers {
		m.Headers = append(m.Headers, sink.Header{Key: h.name, Value: h.get(rec)})
	}
	if r.ce != nil {
		return r.ce.cloudEvent(m, rec)
	}
	return m, nil
}
