package ops

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/outboxdriver"
)

// View is one dead letter as shown to a user: the payload pretty-printed,
// with the sensitive paths masked.
type View struct {
	outboxdriver.DeadLetter
	Seq          int64             `json:"seq"`
	CreatedAt    time.Time         `json:"created_at"`
	Headers      map[string]string `json:"headers"`
	TraceContext string            `json:"tracingspancontext"`
	// Payload is what to show of the payload: indented JSON, or text.
	Payload string `json:"payload"`
	// PayloadNote says what was left out or masked, or is "".
	PayloadNote string `json:"payload_note"`
	// Masked counts the values masked.
	Masked int `json:"masked"`
	// Sensitive lists the sensitive paths of this event (the configured
	// ones and its contract's), which an operator may reveal one at a
	// time (Ops.Reveal); Revealed is the one shown.
	Sensitive []string `json:"sensitive,omitempty"`
	Revealed  string   `json:"revealed,omitempty"`
}

// Mask is what a masked value shows instead.
const Mask = "***"

// maxShown is the largest payload shown; a larger one is summarised.
const maxShown = 1 << 20

func (o *Ops) view(ctx context.Context, d outboxdriver.DeadLetterDetail) View {
	paths, masks, err := o.sensitiveFor(ctx, d.AggregateType, d.Type)
	if err != nil {
		return o.hidden(d, err)
	}
	return o.viewMasked(d, -1, paths, masks)
}

// hidden is the view of d without its payload, because the masking
// stored with the table could not be read (err): what it would mask is
// not known, so nothing is shown.
func (o *Ops) hidden(d outboxdriver.DeadLetterDetail, err error) View {
	o.log.Warn("ops: payload hidden", "event", d.ID, "err", err)
	d.Payload, d.PayloadRaw = nil, nil
	v := o.viewMasked(d, -1, nil, nil)
	v.PayloadNote = "hidden: the masking stored with the table could not be read"
	return v
}

// viewMasked is the view of d with the values at masks hidden, but for
// masks[reveal] (paths[reveal]: the same paths as text). A mask of no
// segment hides the whole payload.
func (o *Ops) viewMasked(d outboxdriver.DeadLetterDetail, reveal int, paths []string, masks [][]string) View {
	v := View{DeadLetter: d.DeadLetter, Seq: d.Seq, CreatedAt: d.CreatedAt, Headers: d.Headers, TraceContext: d.TraceContext,
		Sensitive: paths}
	if reveal >= 0 {
		v.Revealed = paths[reveal]
	}
	switch {
	case d.Payload == nil && d.PayloadRaw == nil:
		v.PayloadNote = "no payload"
	case d.Payload == nil:
		raw := d.PayloadRaw
		switch {
		case len(masks) > 0:
			v.PayloadNote = fmt.Sprintf("%d bytes that are not JSON: hidden, because sensitive paths are configured and cannot be found in them", len(raw))
		case len(raw) > maxShown:
			v.PayloadNote = fmt.Sprintf("%d bytes that are not JSON: too large to show", len(raw))
		case utf8.Valid(raw):
			v.Payload, v.PayloadNote = string(raw), "not JSON: shown as text"
		default:
			shown := raw[:min(len(raw), 4096)]
			v.Payload = hex.Dump(shown)
			v.PayloadNote = fmt.Sprintf("%d bytes that are not JSON: the first %d shown in hexadecimal", len(raw), len(shown))
		}
	case len(d.Payload) > maxShown:
		v.PayloadNote = fmt.Sprintf("%d bytes of JSON: too large to show", len(d.Payload))
	default:
		tree, err := decodeTree(json.NewDecoder(bytes.NewReader(d.Payload)), 0)
		if err != nil {
			if len(masks) > 0 {
				v.PayloadNote = "JSON that could not be read for masking: hidden"
				return v
			}
			v.Payload, v.PayloadNote = string(d.Payload), "shown as stored"
			return v
		}
		for i, m := range masks {
			if i != reveal {
				v.Masked += tree.mask(m)
			}
		}
		var b strings.Builder
		tree.write(&b, "")
		v.Payload = b.String()
		if v.Masked > 0 {
			v.PayloadNote = fmt.Sprintf("%d sensitive value(s) masked", v.Masked)
		}
	}
	return v
}

// sensitiveFor returns an event's sensitive paths, the configured ones
// first, then those stored with the table for it and its contract's
// (each once), and the same paths parsed: masks[i] is paths[i]. When the
// stored ones cannot be read it returns the error, with a mask of the
// whole payload.
func (o *Ops) sensitiveFor(ctx context.Context, aggregateType, eventType string) (paths []string, masks [][]string, err error) {
	stored, err := o.storedMasks(ctx)
	if err != nil {
		return nil, [][]string{{}}, err
	}
	var extra []string
	for _, p := range stored {
		if p.Applies(aggregateType, eventType) {
			extra = append(extra, p.Path)
		}
	}
	if o.cfg.Contracts != nil {
		extra = append(extra, o.cfg.Contracts.SensitivePaths(aggregateType, eventType)...)
	}
	paths, masks = o.withPaths(extra)
	return paths, masks, nil
}

// sensitiveForAny is every path sensitive in any event: the configured
// ones, every one stored with the table and every contract's. What names
// no event type (an audit row's before and after) is masked with all of
// them. When the stored ones cannot be read, the mask is the whole
// payload.
func (o *Ops) sensitiveForAny(ctx context.Context) (paths []string, masks [][]string) {
	stored, err := o.storedMasks(ctx)
	if err != nil {
		o.log.Warn("ops: payload hidden", "err", err)
		return nil, [][]string{{}}
	}
	var extra []string
	for _, p := range stored {
		extra = append(extra, p.Path)
	}
	if o.cfg.Contracts != nil {
		extra = append(extra, o.cfg.Contracts.AllSensitivePaths()...)
	}
	return o.withPaths(extra)
}

// withPaths is the configured sensitive paths and then extra (each once),
// and the same paths parsed: masks[i] is paths[i].
func (o *Ops) withPaths(extra []string) (paths []string, masks [][]string) {
	paths, masks = o.cfg.SensitivePaths, o.masks
	for _, p := range extra {
		if slices.Contains(paths, p) {
			continue
		}
		segs, err := contract.ParsePath(p)
		if err != nil { // a registry checks its paths when it loads
			segs = []string{"*"}
		}
		paths = append(paths[:len(paths):len(paths)], p)
		masks = append(masks[:len(masks):len(masks)], segs)
	}
	return paths, masks
}

// jnode is a JSON value that keeps the order of object keys.
type jnode struct {
	kind byte // '{', '[' or 0 for a scalar
	keys []string
	vals []*jnode
	leaf any // a scalar: string, json.Number, bool or nil
}

const maxDepth = 512

func decodeTree(dec *json.Decoder, depth int) (*jnode, error) {
	if depth == 0 {
		dec.UseNumber()
		n, err := decodeTree(dec, 1)
		if err != nil {
			return nil, err
		}
		if _, err := dec.Token(); err != io.EOF {
			return nil, errors.New("more than one JSON value")
		}
		return n, nil
	}
	if depth > maxDepth {
		return nil, errors.New("nested too deeply")
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return &jnode{leaf: tok}, nil
	}
	n := &jnode{kind: byte(d)}
	for dec.More() {
		if d == '{' {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			n.keys = append(n.keys, k.(string))
		}
		v, err := decodeTree(dec, depth+1)
		if err != nil {
			return nil, err
		}
		n.vals = append(n.vals, v)
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return nil, err
	}
	return n, nil
}

// mask replaces every value at path with Mask and returns how many.
func (n *jnode) mask(path []string) int {
	if len(path) == 0 {
		*n = jnode{leaf: Mask}
		return 1
	}
	count := 0
	for i, v := range n.vals {
		var match bool
		switch n.kind {
		case '{':
			match = path[0] == "*" || path[0] == n.keys[i]
		case '[':
			match = path[0] == "*" || path[0] == strconv.Itoa(i)
		}
		if match {
			count += v.mask(path[1:])
		}
	}
	return count
}

func (n *jnode) write(b *strings.Builder, indent string) {
	switch n.kind {
	case 0:
		b.WriteString(scalar(n.leaf))
		return
	case '{', '[':
		closing := map[byte]string{'{': "}", '[': "]"}[n.kind]
		b.WriteByte(n.kind)
		if len(n.vals) == 0 {
			b.WriteString(closing)
			return
		}
		inner := indent + "  "
		for i, v := range n.vals {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString("\n" + inner)
			if n.kind == '{' {
				b.WriteString(scalar(n.keys[i]) + ": ")
			}
			v.write(b, inner)
		}
		b.WriteString("\n" + indent + closing)
	}
}

func scalar(v any) string {
	if num, ok := v.(json.Number); ok {
		return string(num)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSuffix(buf.String(), "\n")
}
