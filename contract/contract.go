package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/bytedance/sonic"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outboxkit/outbox/outboxdriver"
)

// IndexFile is the name of a registry's index, in the registry's folder.
const IndexFile = "contracts.json"

// VersionHeader is the header that carries an event's contract version.
const VersionHeader = outboxdriver.VersionHeader

// ErrViolation is wrapped by every error about an event that breaks its
// contract, has none (under MissingRefuse), or holds a forbidden field.
var ErrViolation = errors.New("contract violated")

// Missing says what happens to an event whose aggregate type and type have
// no contract in the registry.
type Missing string

// The policies for events without a contract.
const (
	// MissingRefuse refuses them: WriteTx returns an error, the relay
	// dead-letters them. The default: a registry is a promise.
	MissingRefuse Missing = "refuse"
	// MissingAllow lets them through and counts them (Registry.Uncovered).
	MissingAllow Missing = "allow"
)

// Contract is one version of one event's payload contract.
type Contract struct {
	AggregateType string
	Type          string
	// Version is a positive integer, published as header eventVersion.
	Version int
	// File is the schema file, relative to the registry's folder.
	File string
	// DataSchema is the contract's URI for consumers (CloudEvents
	// dataschema): the index's "dataschema", or the schema's "$id".
	DataSchema string
	// Sensitive are the payload paths masked wherever a payload is shown;
	// Forbidden the paths that must never enter the outbox (a payload that
	// holds one is refused). Both are dot-separated: customer.email,
	// cards.*.number. Each holds the index's paths for the contract and
	// then those its schema marks (x-sensitive or writeOnly, x-forbidden).
	Sensitive, Forbidden []string

	schema       *jsonschema.Schema
	onePass      *onePass // nil when the schema uses a keyword it does not take
	noOnePass    string   // why onePass is nil
	doc          any      // the schema document, for Compare
	forbidden    [][]string
	allForbidden [][]string // the registry's forbidden paths and then forbidden, for the one pass
}

// String names the contract as aggregatetype/type/vN.
func (c *Contract) String() string {
	return fmt.Sprintf("%s/%s/v%d", c.AggregateType, c.Type, c.Version)
}

type eventKey struct{ aggregateType, typ string }

// Registry is a loaded folder of contracts. It is safe for concurrent use.
type Registry struct {
	dir       string
	missing   Missing
	sensitive []string // the registry's own sensitive and forbidden paths
	forbidden [][]string
	forbids   []string                 // the registry's own forbidden paths, as written
	versions  map[eventKey][]*Contract // ascending by version
	uncovered atomic.Int64

	mu          sync.Mutex
	uncoveredBy map[eventKey]int64 // at most MaxUncoveredTypes keys, then Other
}

// MaxUncoveredTypes bounds the event types Registry.EachUncovered names:
// the first MaxUncoveredTypes aggregate type and type pairs seen without
// a contract keep their names, later ones are counted under Other, Other.
const MaxUncoveredTypes = 100

// Other stands for the aggregate type and type of every event without a
// contract past the first MaxUncoveredTypes pairs.
const Other = "other"

type indexDoc struct {
	// Missing is "refuse" (the default) or "allow".
	Missing Missing `json:"missing"`
	// Sensitive and Forbidden apply to every event.
	Sensitive []string     `json:"sensitive"`
	Forbidden []string     `json:"forbidden"`
	Contracts []indexEntry `json:"contracts"`
}

type indexEntry struct {
	AggregateType string   `json:"aggregatetype"`
	Type          string   `json:"type"`
	Version       int      `json:"version"`
	Schema        string   `json:"schema"`
	DataSchema    string   `json:"dataschema"`
	Sensitive     []string `json:"sensitive"`
	Forbidden     []string `json:"forbidden"`
}

// Load reads the registry in dir: its index (contracts.json) and every
// schema the index names, compiled. Any error (an index or a schema that
// does not parse, a schema that is not valid JSON Schema, a duplicate
// contract, a bad path) fails the whole load, naming the file.
func Load(dir string) (*Registry, error) {
	idxPath := filepath.Join(dir, IndexFile)
	raw, err := os.ReadFile(idxPath)
	if err != nil {
		return nil, fmt.Errorf("contract registry %s: %w", dir, err)
	}
	var idx indexDoc
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&idx); err != nil {
		return nil, fmt.Errorf("contract registry %s: %s: %w", dir, IndexFile, err)
	}
	r := &Registry{dir: dir, missing: idx.Missing, versions: map[eventKey][]*Contract{}}
	switch r.missing {
	case "":
		r.missing = MissingRefuse
	case MissingRefuse, MissingAllow:
	default:
		return nil, fmt.Errorf("contract registry %s: %s: missing %q: use refuse or allow", dir, IndexFile, idx.Missing)
	}
	if r.sensitive, _, err = paths(idx.Sensitive); err != nil {
		return nil, fmt.Errorf("contract registry %s: %s: sensitive %w", dir, IndexFile, err)
	}
	if _, r.forbidden, err = paths(idx.Forbidden); err != nil {
		return nil, fmt.Errorf("contract registry %s: %s: forbidden %w", dir, IndexFile, err)
	}
	r.forbids = idx.Forbidden
	r.sensitive = append(r.sensitive, idx.Forbidden...) // never shown, should one be there
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	comp := newCompiler()
	for i, e := range idx.Contracts {
		c, err := r.compile(comp, absDir, e)
		if err != nil {
			return nil, fmt.Errorf("contract registry %s: %s: contract %d: %w", dir, IndexFile, i, err)
		}
		k := eventKey{c.AggregateType, c.Type}
		for _, o := range r.versions[k] {
			if o.Version == c.Version {
				return nil, fmt.Errorf("contract registry %s: %s: contract %s is listed twice", dir, IndexFile, c)
			}
		}
		r.versions[k] = append(r.versions[k], c)
	}
	for _, vs := range r.versions {
		slices.SortFunc(vs, func(a, b *Contract) int { return a.Version - b.Version })
	}
	return r, nil
}

// newCompiler returns a JSON Schema compiler that knows the marks.
func newCompiler() *jsonschema.Compiler {
	comp := jsonschema.NewCompiler()
	comp.RegisterVocabulary(marksVocabulary())
	comp.AssertVocabs() // let the marks compile under every draft
	return comp
}

func (r *Registry) compile(comp *jsonschema.Compiler, absDir string, e indexEntry) (*Contract, error) {
	switch {
	case strings.TrimSpace(e.AggregateType) == "" || strings.TrimSpace(e.Type) == "":
		return nil, errors.New("aggregatetype and type are required")
	case e.Version < 1:
		return nil, fmt.Errorf("%s/%s: version %d: want a positive integer", e.AggregateType, e.Type, e.Version)
	case e.Schema == "" || filepath.IsAbs(e.Schema) || !filepath.IsLocal(e.Schema):
		return nil, fmt.Errorf("%s/%s/v%d: schema %q: want a file inside the registry's folder", e.AggregateType, e.Type, e.Version, e.Schema)
	}
	c := &Contract{AggregateType: e.AggregateType, Type: e.Type, Version: e.Version, File: e.Schema, DataSchema: e.DataSchema}
	var err error
	if c.Sensitive, _, err = paths(e.Sensitive); err != nil {
		return nil, fmt.Errorf("%s: sensitive %w", c, err)
	}
	if _, c.forbidden, err = paths(e.Forbidden); err != nil {
		return nil, fmt.Errorf("%s: forbidden %w", c, err)
	}
	c.Forbidden = e.Forbidden
	p := filepath.Join(absDir, e.Schema)
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c, err)
	}
	c.doc, err = jsonschema.UnmarshalJSON(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: schema %s does not parse as JSON: %w", c, e.Schema, err)
	}
	if err := comp.AddResource(p, c.doc); err != nil {
		var exists *jsonschema.ResourceExistsError
		if !errors.As(err, &exists) { // two versions may share a file
			return nil, fmt.Errorf("%s: schema %s: %w", c, e.Schema, err)
		}
	}
	if c.schema, err = comp.Compile(p); err != nil {
		return nil, fmt.Errorf("%s: schema %s is not a valid JSON Schema: %w", c, e.Schema, err)
	}
	c.onePass, c.noOnePass = buildOnePass(c.schema)
	marked, err := marks(c.schema)
	if err != nil {
		return nil, fmt.Errorf("%s: schema %s: %w", c, e.Schema, err)
	}
	c.Sensitive = append(c.Sensitive, marked.sensitive...)
	c.Forbidden = append(c.Forbidden, marked.forbidden...)
	for _, p := range marked.forbidden {
		c.forbidden = append(c.forbidden, strings.Split(p, "."))
	}
	c.allForbidden = slices.Concat(r.forbidden, c.forbidden)
	if c.DataSchema == "" {
		if m, ok := c.doc.(map[string]any); ok {
			c.DataSchema, _ = m["$id"].(string)
		}
	}
	return c, nil
}

// OnePass reports whether the contract's valid events are checked in one
// pass over their bytes (a few microseconds a kilobyte) rather than by the
// JSON Schema library alone (tens of microseconds), and when not, why:
// the first keyword that keeps them on the library's path, and where in
// the schema (docs/contracts.md, "What a check costs").
func (c *Contract) OnePass() (ok bool, why string) {
	return c.onePass != nil, c.noOnePass
}

// Dir returns the folder the registry was loaded from.
func (r *Registry) Dir() string { return r.dir }

// MissingPolicy returns what happens to an event without a contract.
func (r *Registry) MissingPolicy() Missing { return r.missing }

// SetMissing changes the policy for events without a contract (the
// index's "missing"), for a caller that decides it elsewhere (a flag).
// Call it before the registry is in use.
func (r *Registry) SetMissing(m Missing) error {
	if m != MissingRefuse && m != MissingAllow {
		return fmt.Errorf("contract: missing %q: use refuse or allow", m)
	}
	r.missing = m
	return nil
}

// Uncovered counts the events let through without a contract under
// MissingAllow since the registry was loaded (not those refused for a
// forbidden field or a payload that is not JSON).
func (r *Registry) Uncovered() int64 { return r.uncovered.Load() }

// EachUncovered calls fn with the count of the events let through without
// a contract under MissingAllow since the registry was loaded, by
// aggregate type and type (at most MaxUncoveredTypes pairs, then Other,
// Other), in no particular order. outboxprom.RegisterContracts exports
// them as outbox_contract_uncovered_events_total.
func (r *Registry) EachUncovered(fn func(aggregateType, eventType string, events int64)) {
	r.mu.Lock()
	counts := make(map[eventKey]int64, len(r.uncoveredBy))
	for k, n := range r.uncoveredBy {
		counts[k] = n
	}
	r.mu.Unlock()
	for k, n := range counts {
		fn(k.aggregateType, k.typ, n)
	}
}

func (r *Registry) countUncovered(aggregateType, eventType string) {
	r.uncovered.Add(1)
	k := eventKey{aggregateType, eventType}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.uncoveredBy == nil {
		r.uncoveredBy = map[eventKey]int64{}
	}
	if _, ok := r.uncoveredBy[k]; !ok && len(r.uncoveredBy) >= MaxUncoveredTypes {
		k = eventKey{Other, Other}
	}
	r.uncoveredBy[k]++
}

// Contracts returns every contract, ordered by aggregate type, type and
// version.
func (r *Registry) Contracts() []*Contract {
	var all []*Contract
	for _, vs := range r.versions {
		all = append(all, vs...)
	}
	slices.SortFunc(all, func(a, b *Contract) int {
		return cmpContracts(a, b)
	})
	return all
}

func cmpContracts(a, b *Contract) int {
	if c := strings.Compare(a.AggregateType, b.AggregateType); c != 0 {
		return c
	}
	if c := strings.Compare(a.Type, b.Type); c != 0 {
		return c
	}
	return a.Version - b.Version
}

// Lookup returns the contract of an event: the given version, or the
// latest when version is "". It returns nil, nil when the event type has
// no contract at all, and an error for a version that is not a positive
// integer or that the registry does not hold.
func (r *Registry) Lookup(aggregateType, eventType, version string) (*Contract, error) {
	vs := r.versions[eventKey{aggregateType, eventType}]
	if version == "" {
		if len(vs) == 0 {
			return nil, nil
		}
		return vs[len(vs)-1], nil
	}
	n, err := strconv.Atoi(version)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("%w: %s %q is not a positive integer", ErrViolation, VersionHeader, version)
	}
	for _, c := range vs {
		if c.Version == n {
			return c, nil
		}
	}
	if len(vs) == 0 {
		return nil, nil
	}
	return nil, fmt.Errorf("%w: %s/%s has no contract version %d (the registry holds %s)", ErrViolation, aggregateType, eventType, n, versionList(vs))
}

func versionList(vs []*Contract) string {
	s := make([]string, len(vs))
	for i, c := range vs {
		s[i] = strconv.Itoa(c.Version)
	}
	return strings.Join(s, ", ")
}

// Check validates one event's payload against its contract: version is
// the event's eventVersion header, or "" for the latest. It returns the
// version the event goes out with ("" when it has no contract and the
// registry allows that). payload is JSON text, or nil; raw is true for a
// payload that is not JSON, which no contract accepts. A payload that is
// given as JSON (raw false) but does not parse is refused, whether the
// event has a contract or not: Check parses it once, so that the writer
// need not check it is JSON beforehand. The error wraps ErrViolation and
// names the failing locations and keywords, never a value of the payload.
func (r *Registry) Check(aggregateType, eventType, version string, payload []byte, raw bool) (string, error) {
	return r.check(aggregateType, eventType, version, payload, raw, false)
}

// check is Check; notJSONIsRaw (the relay's reading of a stored payload)
// takes a payload that does not parse as a raw one rather than refusing
// it, so that a raw payload is parsed once, not scanned and then parsed.
func (r *Registry) check(aggregateType, eventType, version string, payload []byte, raw, notJSONIsRaw bool) (string, error) {
	c, err := r.Lookup(aggregateType, eventType, version)
	if err != nil {
		return "", err
	}
	if c == nil {
		if r.missing != MissingAllow {
			return "", fmt.Errorf("%w: %s/%s has no contract in the registry (its missing policy is refuse)", ErrViolation, aggregateType, eventType)
		}
		if err := r.uncoveredPayload(payload, raw, notJSONIsRaw); err != nil {
			return "", err
		}
		r.countUncovered(aggregateType, eventType)
		return version, nil
	}
	if raw {
		return "", fmt.Errorf("%w: %s: the payload is not JSON (RawPayload); the contract is a JSON Schema", ErrViolation, c)
	}
	if payload != nil && c.onePass != nil && c.onePass.accepts(payload, c.allForbidden) {
		return strconv.Itoa(c.Version), nil
	}
	var doc any // SQL NULL validates as JSON null
	if payload != nil {
		if doc, err = decode(payload); err != nil {
			return "", fmt.Errorf("%w: %s: the payload is not JSON", ErrViolation, c)
		}
	}
	if err := r.validate(c, doc); err != nil {
		return "", err
	}
	return strconv.Itoa(c.Version), nil
}

// uncoveredPayload checks the payload of an event without a contract: it
// must be JSON (unless raw, or notJSONIsRaw) and hold no field the
// registry forbids.
func (r *Registry) uncoveredPayload(payload []byte, raw, notJSONIsRaw bool) error {
	if payload == nil || raw {
		return nil
	}
	if len(r.forbidden) == 0 {
		if !notJSONIsRaw && !json.Valid(payload) {
			return fmt.Errorf("%w: the payload is not JSON (use RawPayload for other formats)", ErrViolation)
		}
		return nil
	}
	if anyPass.accepts(payload, r.forbidden) {
		return nil
	}
	doc, err := decode(payload)
	switch {
	case err != nil && notJSONIsRaw:
		return nil
	case err != nil: // the parser's message may quote the payload
		return fmt.Errorf("%w: the payload is not JSON (use RawPayload for other formats)", ErrViolation)
	}
	return forbiddenIn(doc, r.forbidden)
}

// validate checks a decoded payload against c: forbidden fields first,
// then the JSON Schema.
func (r *Registry) validate(c *Contract, doc any) error {
	if err := forbiddenIn(doc, r.forbidden, c.forbidden); err != nil {
		return fmt.Errorf("%s: %w", c, err)
	}
	if err := c.schema.Validate(doc); err != nil {
		return fmt.Errorf("%w: %s: %s", ErrViolation, c, describe(err))
	}
	return nil
}

// decoder reads JSON into the value form the JSON Schema library validates:
// map[string]any, []any, string, json.Number (exact, never a float64),
// bool and nil, in one pass. Strings are not copied out of the payload:
// nothing decoded outlives the check. ValidateString refuses control
// characters in strings, as encoding/json does. It stops at 4096 levels
// of nesting.
var decoder = sonic.Config{UseNumber: true, ValidateString: true}.Froze()

// decode parses one JSON value into the form the validator takes. It
// accepts and refuses the same texts as encoding/json: what the fast
// decoder refuses (malformed, or nested deeper than it goes) is decoded
// again by encoding/json, which has the last word, so only a payload that
// is refused anyway pays twice.
func decode(payload []byte) (any, error) {
	var doc any
	if err := decoder.Unmarshal(payload, &doc); err == nil {
		return doc, nil
	}
	return jsonschema.UnmarshalJSON(bytes.NewReader(payload))
}

// CheckRecord is Check for a claimed record, for the relay: it validates
// the payload against the contract its eventVersion header names (the
// latest when none) and sets the header when the record lacks it. A
// payload that does not parse as JSON is a raw one (the relay cannot tell
// them apart otherwise). A record whose headers could not be read is left
// to the router.
func (r *Registry) CheckRecord(rec *outboxdriver.Record) error {
	if rec.HeadersErr != nil {
		return nil
	}
	given := rec.Headers[VersionHeader]
	v, err := r.check(rec.AggregateType, rec.Type, given, rec.Payload, false, true)
	if err != nil {
		return err
	}
	if given == "" && v != "" {
		h := make(map[string]string, len(rec.Headers)+1)
		for k, val := range rec.Headers {
			h[k] = val
		}
		h[VersionHeader] = v
		rec.Headers = h
	}
	return nil
}

// SensitivePaths returns the payload paths to mask for an event: the
// registry's own and those of every version of the event's contract (a
// field sensitive in one version is masked in all).
func (r *Registry) SensitivePaths(aggregateType, eventType string) []string {
	out := slices.Clone(r.sensitive)
	for _, c := range r.versions[eventKey{aggregateType, eventType}] {
		out = append(out, c.Sensitive...)
		out = append(out, c.Forbidden...) // should never be there; if it is, never show it
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ForbiddenPaths returns the payload paths an event of contract c must
// never hold: the registry's own and the contract's.
func (r *Registry) ForbiddenPaths(c *Contract) []string {
	out := append(slices.Clone(r.forbids), c.Forbidden...)
	slices.Sort(out)
	return slices.Compact(out)
}

// RegistryPaths returns the registry's own sensitive and forbidden
// paths (contracts.json's "sensitive" and "forbidden"), which apply to
// every event.
func (r *Registry) RegistryPaths() []string { return slices.Clone(r.sensitive) }

// AllSensitivePaths returns every path SensitivePaths returns for any
// event: the registry's own and every contract's.
func (r *Registry) AllSensitivePaths() []string {
	out := slices.Clone(r.sensitive)
	for _, vs := range r.versions {
		for _, c := range vs {
			out = append(out, c.Sensitive...)
			out = append(out, c.Forbidden...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// describe renders a validation error as its failing locations and
// keywords, without the values a library message may quote.
func describe(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return "the payload does not validate"
	}
	var leaves []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			kw := "schema"
			if e.ErrorKind != nil {
				if p := e.ErrorKind.KeywordPath(); len(p) > 0 {
					kw = strings.Join(p, "/")
				}
			}
			leaves = append(leaves, fmt.Sprintf("at /%s: fails %s", strings.Join(e.InstanceLocation, "/"), kw))
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	slices.Sort(leaves)
	leaves = slices.Compact(leaves)
	const most = 5
	if len(leaves) > most {
		leaves = append(leaves[:most], fmt.Sprintf("and %d more", len(leaves)-most))
	}
	return strings.Join(leaves, "; ")
}

// ParsePath reads a dot-separated JSON path (customer.email,
// cards.*.number; * matches any key or array index).
func ParsePath(p string) ([]string, error) {
	if p == "" {
		return nil, errors.New("empty")
	}
	segs := strings.Split(p, ".")
	for _, s := range segs {
		if s == "" {
			return nil, errors.New("an empty segment: write segments separated by single dots, e.g. customer.email")
		}
	}
	return segs, nil
}

func paths(ps []string) ([]string, [][]string, error) {
	var segs [][]string
	for _, p := range ps {
		s, err := ParsePath(p)
		if err != nil {
			return nil, nil, fmt.Errorf("path %q: %w", p, err)
		}
		segs = append(segs, s)
	}
	return ps, segs, nil
}

// forbiddenIn returns an error naming the first forbidden path doc holds.
func forbiddenIn(doc any, sets ...[][]string) error {
	for _, set := range sets {
		for _, p := range set {
			if present(doc, p) {
				return fmt.Errorf("%w: the payload holds %s, which must never enter the outbox", ErrViolation, strings.Join(p, "."))
			}
		}
	}
	return nil
}

func present(v any, path []string) bool {
	if len(path) == 0 {
		return true
	}
	switch n := v.(type) {
	case map[string]any:
		if path[0] == "*" {
			for _, c := range n {
				if present(c, path[1:]) {
					return true
				}
			}
			return false
		}
		c, ok := n[path[0]]
		return ok && present(c, path[1:])
	case []any:
		for i, c := range n {
			if (path[0] == "*" || path[0] == strconv.Itoa(i)) && present(c, path[1:]) {
				return true
			}
		}
	}
	return false
}

// DataSchema returns the URI of an event's contract (its "dataschema", or
// the schema's $id): the given version, or the latest for "". It returns
// "" when the registry names none.
func (r *Registry) DataSchema(aggregateType, eventType, version string) string {
	c, err := r.Lookup(aggregateType, eventType, version)
	if err != nil || c == nil {
		return ""
	}
	return c.DataSchema
}
