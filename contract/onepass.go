package contract

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/big"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The one-pass check.
//
// Decoding a payload into values and handing them to the JSON Schema
// library costs tens of microseconds for a kilobyte: the library visits
// every value through allocated scopes and compares every number with
// exact big.Rat arithmetic. Most contracts use a handful of keywords, and
// most events are valid. For those, a contract also gets a onePass: the
// library's own compiled schema (*jsonschema.Schema), reduced to the
// keywords below, checked in one pass over the payload's bytes without
// building a value or allocating.
//
// A onePass only ever says yes. It says no when the payload breaks the
// contract, and also whenever it is not sure (a number it cannot compare
// exactly, an escape or a byte sequence encoding/json would rewrite, a
// duplicate key holding a forbidden field, nesting deeper than it goes).
// A no sends the payload through the library, which gives the verdict
// and the error, exactly as without the one-pass check. So a onePass can
// make a check faster, never change its verdict: that is what
// FuzzOnePassNeverAcceptsWhatTheLibraryRefuses checks, and the tests of
// every keyword with payloads each side of its bound.
//
// Keywords it takes: type, enum and const (of strings, numbers, booleans
// and null), properties, required, additionalProperties (false or a
// schema), items (one schema for every item), minItems, maxItems,
// uniqueItems (of up to 32 strings without escapes, numbers, booleans and
// nulls), minLength, maxLength, pattern, format (asserted with the
// library's own format checks, as draft 7 and older do), minimum, maximum,
// exclusiveMinimum, exclusiveMaximum and multipleOf (numbers compared
// exactly as decimals of up to 19 significant digits), allOf and anyOf
// (the value is read again for each schema, within a budget of visits),
// $ref (beside other keywords from draft 2019-09 on, as one more schema
// the value must pass), true and false schemas, the x-sensitive and
// x-forbidden marks, and every annotation. A schema that uses any other
// keyword anywhere (oneOf, not, if, patternProperties,
// unevaluatedProperties, contains, the format regex, ...) has no
// onePass: its events go through the library alone.

// Type bits of a onePass node; 0 takes every type.
const (
	tNull uint8 = 1 << iota
	tBool
	tNumber // every number
	tInteger
	tString
	tArray
	tObject
)

// maxOnePassDepth bounds the nesting a onePass follows; deeper payloads
// go to the library.
const maxOnePassDepth = 256

// decimal is ±mant × 10^exp, exactly: a JSON number of at most 19
// significant digits, or a schema's bound or enum number.
type decimal struct {
	neg  bool
	mant uint64
	exp  int
}

type bound struct {
	set bool
	v   decimal
}

type key struct {
	n    *node  // the property's schema; nil for a required name without one
	bit  uint64 // its bit in node.required, or 0
	prop bool
}

// node is one schema of a onePass.
type node struct {
	ref   *node // a schema that is only a $ref: check this one instead
	any   bool  // true, or only annotations: every value
	none  bool  // false: no value
	types uint8

	hasEnum                       bool
	enumStrings                   []string
	enumNumbers                   []decimal
	enumNull, enumTrue, enumFalse bool

	minLen, maxLen int // -1 when unset
	pattern        jsonschema.Regexp
	format         *jsonschema.Format // asserted (draft 7 and older, or when asked)

	min, max, exclMin, exclMax bound
	multipleOf                 *decimal

	// composite: the value must pass every allOf schema (the first holds
	// the node's own keywords) and one of the anyOf schemas, if any.
	composite    bool
	allOf, anyOf []*node

	keys       map[string]key
	required   uint64 // the bits of every required name
	additional *node  // nil: every other property is fine

	items              *node // nil: every item is fine
	minItems, maxItems int   // -1 when unset
	uniqueItems        bool
}

var (
	anyNode  = &node{any: true, minLen: -1, maxLen: -1, minItems: -1, maxItems: -1}
	noneNode = &node{none: true, minLen: -1, maxLen: -1, minItems: -1, maxItems: -1}
)

type onePass struct{ root *node }

// anyPass takes every JSON text; it checks the forbidden paths of an event
// without a contract.
var anyPass = &onePass{root: anyNode}

// newOnePass reduces a compiled schema to a onePass, or returns nil when
// the schema uses a keyword the one pass does not take.
func newOnePass(s *jsonschema.Schema) *onePass {
	o, _ := buildOnePass(s)
	return o
}

// buildOnePass is newOnePass, and says why there is none: the first
// keyword the one pass does not take, and where.
func buildOnePass(s *jsonschema.Schema) (*onePass, string) {
	b := builder{built: map[*jsonschema.Schema]*node{}}
	root := b.node(s)
	if b.why != "" {
		return nil, b.why
	}
	schemas := slices.SortedFunc(maps.Keys(b.built), func(a, b *jsonschema.Schema) int { return strings.Compare(a.Location, b.Location) })
	for _, sch := range schemas { // a cycle of schemas that are only $refs
		seen := 0
		for m := b.built[sch]; m.ref != nil; m = m.ref {
			if seen++; seen > len(b.built) {
				return nil, "a cycle of $refs at " + where(sch)
			}
		}
	}
	return &onePass{root: root}, ""
}

type builder struct {
	built map[*jsonschema.Schema]*node
	why   string // the first reason there is no onePass
}

func (b *builder) fail(s *jsonschema.Schema, keyword string) *node {
	if b.why == "" {
		b.why = keyword + " at " + where(s)
	}
	return anyNode
}

// where names a schema by its file's name and its JSON pointer in it.
func where(s *jsonschema.Schema) string {
	loc := s.Location
	if i := strings.LastIndexByte(loc, '#'); i >= 0 {
		return path.Base(loc[:i]) + loc[i:]
	}
	return path.Base(loc)
}

func (b *builder) node(s *jsonschema.Schema) *node {
	if s == nil {
		return anyNode
	}
	if n, ok := b.built[s]; ok {
		return n
	}
	n := &node{minLen: -1, maxLen: -1, minItems: -1, maxItems: -1}
	b.built[s] = n
	if s.Bool != nil {
		n.any, n.none = *s.Bool, !*s.Bool
		return n
	}
	if kw := unsupported(s); kw != "" {
		return b.fail(s, kw)
	}
	for _, e := range s.Extensions {
		if _, ok := e.(*mark); !ok {
			return b.fail(s, fmt.Sprintf("a keyword of another vocabulary (%T)", e))
		}
	}
	if s.Ref != nil {
		if s.DraftVersion < 2019 || !validates(s) { // its siblings do not count, or there are none
			n.ref = b.node(s.Ref)
			return n
		}
		n.allOf = append(n.allOf, b.node(s.Ref)) // both apply
	}
	if !validates(s) {
		n.any = true
		return n
	}
	if s.Types != nil {
		for _, t := range s.Types.ToStrings() {
			n.types |= map[string]uint8{"null": tNull, "boolean": tBool, "number": tNumber,
				"integer": tInteger, "string": tString, "array": tArray, "object": tObject}[t]
		}
	}
	var values []any
	if s.Enum != nil {
		values = s.Enum.Values
	}
	if s.Const != nil {
		if s.Enum != nil {
			return b.fail(s, "enum with const")
		}
		values = []any{*s.Const}
	}
	if values != nil {
		n.hasEnum = true
		for _, v := range values {
			switch v := v.(type) {
			case string:
				n.enumStrings = append(n.enumStrings, v)
			case nil:
				n.enumNull = true
			case bool:
				n.enumTrue, n.enumFalse = n.enumTrue || v, n.enumFalse || !v
			case json.Number:
				r, ok := new(big.Rat).SetString(string(v))
				d, exact := decimalOf(r)
				if !ok || !exact {
					return b.fail(s, "enum or const with a number of more than 19 significant digits ("+string(v)+")")
				}
				n.enumNumbers = append(n.enumNumbers, d)
			default:
				return b.fail(s, fmt.Sprintf("enum or const with a value of type %T", v))
			}
		}
	}
	if s.MinLength != nil {
		n.minLen = *s.MinLength
	}
	if s.MaxLength != nil {
		n.maxLen = *s.MaxLength
	}
	n.pattern, n.format = s.Pattern, s.Format
	for _, c := range []struct {
		r *big.Rat
		b *bound
	}{{s.Minimum, &n.min}, {s.Maximum, &n.max}, {s.ExclusiveMinimum, &n.exclMin}, {s.ExclusiveMaximum, &n.exclMax}} {
		if c.r == nil {
			continue
		}
		d, ok := decimalOf(c.r)
		if !ok {
			return b.fail(s, "a bound that is not a decimal of at most 19 significant digits ("+c.r.RatString()+")")
		}
		*c.b = bound{set: true, v: d}
	}
	if len(s.Required) > 64 {
		return b.fail(s, "required with more than 64 names")
	}
	if len(s.Properties) > 0 || len(s.Required) > 0 {
		n.keys = make(map[string]key, len(s.Properties)+len(s.Required))
	}
	for _, name := range slices.Sorted(maps.Keys(s.Properties)) { // the first reason is the same every time
		n.keys[name] = key{n: b.node(s.Properties[name]), prop: true}
	}
	for i, name := range s.Required {
		k := n.keys[name]
		if k.bit != 0 { // listed twice
			continue
		}
		k.bit = 1 << i
		n.keys[name] = k
		n.required |= k.bit
	}
	switch a := s.AdditionalProperties.(type) {
	case nil:
	case bool:
		if !a {
			n.additional = noneNode
		}
	case *jsonschema.Schema:
		n.additional = b.node(a)
	default:
		return b.fail(s, "additionalProperties")
	}
	if s.DraftVersion >= 2020 {
		if s.Items2020 != nil {
			n.items = b.node(s.Items2020)
		}
	} else if s.Items != nil {
		items, ok := s.Items.(*jsonschema.Schema)
		if !ok {
			return b.fail(s, "items with a schema per position")
		}
		n.items = b.node(items)
	}
	for _, m := range s.AllOf {
		n.allOf = append(n.allOf, b.node(m))
	}
	for _, m := range s.AnyOf {
		n.anyOf = append(n.anyOf, b.node(m))
	}
	if s.MultipleOf != nil {
		d, ok := decimalOf(s.MultipleOf)
		if !ok || d.mant == 0 {
			return b.fail(s, "a multipleOf that is not a decimal of at most 19 significant digits ("+s.MultipleOf.RatString()+")")
		}
		n.multipleOf = &d
	}
	if s.MinItems != nil {
		n.minItems = *s.MinItems
	}
	if s.MaxItems != nil {
		n.maxItems = *s.MaxItems
	}
	n.uniqueItems = s.UniqueItems
	if len(n.allOf) > 0 || len(n.anyOf) > 0 {
		// n becomes the composite, in place (other schemas may point to
		// it already); its own keywords move to a node of their own, the
		// first the value must pass.
		own := *n
		own.allOf, own.anyOf = nil, nil
		*n = node{composite: true, allOf: append([]*node{&own}, n.allOf...), anyOf: n.anyOf,
			minLen: -1, maxLen: -1, minItems: -1, maxItems: -1}
	}
	return n
}

// unsupported returns the first keyword of s a onePass does not take, or
// "".
func unsupported(s *jsonschema.Schema) string {
	for _, k := range []struct {
		used    bool
		keyword string
	}{
		{s.RecursiveRef != nil, "$recursiveRef"}, {s.DynamicRef != nil, "$dynamicRef"},
		{s.Not != nil, "not"}, {len(s.OneOf) > 0, "oneOf"},
		{s.If != nil, "if"}, {s.Then != nil, "then"}, {s.Else != nil, "else"},
		{s.Format != nil && s.Format.Name == "regex", "format regex"},
		{s.MaxProperties != nil, "maxProperties"}, {s.MinProperties != nil, "minProperties"},
		{s.PropertyNames != nil, "propertyNames"}, {len(s.PatternProperties) > 0, "patternProperties"},
		{len(s.Dependencies) > 0, "dependencies"}, {len(s.DependentRequired) > 0, "dependentRequired"},
		{len(s.DependentSchemas) > 0, "dependentSchemas"}, {s.UnevaluatedProperties != nil, "unevaluatedProperties"},
		{s.Contains != nil, "contains"},
		{s.MinContains != nil, "minContains"}, {s.MaxContains != nil, "maxContains"},
		{s.AdditionalItems != nil, "additionalItems"}, {len(s.PrefixItems) > 0, "prefixItems"},
		{s.UnevaluatedItems != nil, "unevaluatedItems"}, {s.ContentEncoding != nil, "contentEncoding"},
		{s.ContentMediaType != nil, "contentMediaType"}, {s.ContentSchema != nil, "contentSchema"},
		{s.DraftVersion >= 2020 && s.Items != nil, "items"},
	} {
		if k.used {
			return k.keyword
		}
	}
	return ""
}

// validates reports whether s has a keyword the one pass checks (beside
// $ref): without one, it takes every value.
func validates(s *jsonschema.Schema) bool {
	return s.Types != nil || s.Enum != nil || s.Const != nil ||
		s.MinLength != nil || s.MaxLength != nil || s.Pattern != nil || s.Format != nil ||
		s.Minimum != nil || s.Maximum != nil || s.ExclusiveMinimum != nil || s.ExclusiveMaximum != nil ||
		len(s.Properties) > 0 || len(s.Required) > 0 || s.AdditionalProperties != nil ||
		s.Items != nil || s.Items2020 != nil || s.MinItems != nil || s.MaxItems != nil ||
		len(s.AllOf) > 0 || len(s.AnyOf) > 0 || s.MultipleOf != nil || s.UniqueItems
}

// accepts reports whether payload, one JSON text, is valid against the
// schema and holds none of the forbidden paths. False means the payload
// is invalid or the one pass is not sure: ask the library.
func (o *onePass) accepts(payload []byte, forbidden ...[][]string) bool {
	w := walker{p: payload, budget: 8*len(payload) + 1024}
	var paths [][]string
	if len(forbidden) == 1 {
		paths = forbidden[0]
	} else {
		paths = slices.Concat(forbidden...)
	}
	if !w.value(o.root, paths, 0) {
		return false
	}
	w.space()
	return w.i == len(w.p)
}

// walker reads one JSON text while it checks it.
type walker struct {
	p      []byte
	i      int
	buf    []byte // a string with escapes, unescaped
	budget int    // values left to visit: allOf and anyOf walk a value again
}

func (w *walker) space() {
	for w.i < len(w.p) {
		switch w.p[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

// value checks the value at w.i against n. paths are the forbidden paths
// still open at this value: their remaining segments.
func (w *walker) value(n *node, paths [][]string, depth int) bool {
	for n.ref != nil {
		n = n.ref
	}
	if w.budget--; n.none || depth > maxOnePassDepth || w.budget < 0 {
		return false
	}
	if n.composite {
		return w.composite(n, paths, depth)
	}
	w.space()
	if w.i >= len(w.p) {
		return false
	}
	switch c := w.p[w.i]; {
	case c == '{': // an enum holds no objects or arrays (see builder.node)
		return n.is(tObject) && (!n.hasEnum || n.any) && w.object(n, paths, depth)
	case c == '[':
		return n.is(tArray) && (!n.hasEnum || n.any) && w.array(n, paths, depth)
	case c == '"':
		if !n.is(tString) {
			return false
		}
		s, runes, ok := w.str()
		return ok && n.string(s, runes)
	case c == 't':
		return w.literal("true") && n.is(tBool) && (!n.hasEnum || n.enumTrue)
	case c == 'f':
		return w.literal("false") && n.is(tBool) && (!n.hasEnum || n.enumFalse)
	case c == 'n':
		return w.literal("null") && n.is(tNull) && (!n.hasEnum || n.enumNull)
	case c == '-' || c >= '0' && c <= '9':
		return w.number(n)
	}
	return false
}

// composite reads the value at w.i once for each schema of n.
func (w *walker) composite(n *node, paths [][]string, depth int) bool {
	w.space()
	start := w.i
	end := -1 // every schema reads the same value: it ends here
	for _, m := range n.allOf {
		if w.i = start; !w.value(m, paths, depth+1) {
			return false
		}
		end = w.i
	}
	if len(n.anyOf) > 0 {
		if !slices.ContainsFunc(n.anyOf, func(m *node) bool { w.i = start; return w.value(m, paths, depth+1) }) {
			return false
		}
		end = w.i
	}
	w.i = end
	return true
}

func (n *node) is(t uint8) bool {
	return n.any || n.types == 0 || n.types&t != 0
}

func (w *walker) literal(lit string) bool {
	if len(w.p)-w.i < len(lit) || string(w.p[w.i:w.i+len(lit)]) != lit {
		return false
	}
	w.i += len(lit)
	return true
}

func (w *walker) object(n *node, paths [][]string, depth int) bool {
	w.i++ // {
	var seen uint64
	w.space()
	if w.i < len(w.p) && w.p[w.i] == '}' {
		w.i++
		return n.any || seen&n.required == n.required
	}
	for {
		w.space()
		if w.i >= len(w.p) || w.p[w.i] != '"' {
			return false
		}
		name, _, ok := w.str()
		if !ok {
			return false
		}
		child := n.additional
		if n.any {
			child = anyNode
		} else if k, ok := n.keys[unsafeString(name)]; ok {
			seen |= k.bit
			if k.prop {
				child = k.n
			}
		}
		if child == nil {
			child = anyNode
		}
		next, hit := follow(paths, unsafeString(name))
		if hit {
			return false
		}
		w.space()
		if w.i >= len(w.p) || w.p[w.i] != ':' {
			return false
		}
		w.i++
		if !w.value(child, next, depth+1) {
			return false
		}
		if done, ok := w.after('}'); !ok {
			return false
		} else if done {
			return n.any || seen&n.required == n.required
		}
	}
}

// after reads what follows a member or an item: a comma, or the closing
// bracket (done).
func (w *walker) after(closing byte) (done, ok bool) {
	w.space()
	if w.i >= len(w.p) {
		return false, false
	}
	switch w.p[w.i] {
	case ',':
		w.i++
		return false, true
	case closing:
		w.i++
		return true, true
	}
	return false, false
}

// follow returns the forbidden paths that go on below the key or index
// name, and whether one of them ends there (the payload holds it).
func follow(paths [][]string, name string) (next [][]string, hit bool) {
	for _, p := range paths {
		if p[0] != "*" && p[0] != name {
			continue
		}
		if len(p) == 1 {
			return nil, true
		}
		next = append(next, p[1:])
	}
	return next, false
}

func (w *walker) array(n *node, paths [][]string, depth int) bool {
	w.i++ // [
	items := n.items
	if items == nil || n.any {
		items = anyNode
	}
	count := 0
	var seen []itemKey // with uniqueItems: the items so far
	w.space()
	if w.i < len(w.p) && w.p[w.i] == ']' {
		w.i++
		return n.itemsWithin(count)
	}
	for {
		var next [][]string
		if len(paths) > 0 {
			var hit bool
			if next, hit = follow(paths, strconv.Itoa(count)); hit {
				return false
			}
		}
		w.space()
		start := w.i
		if !w.value(items, next, depth+1) {
			return false
		}
		if n.uniqueItems && !n.any {
			k, ok := keyOf(w.p[start:w.i])
			if !ok || len(seen) == maxUniqueItems || slices.ContainsFunc(seen, k.equal) {
				return false
			}
			seen = append(seen, k)
		}
		count++
		if done, ok := w.after(']'); !ok {
			return false
		} else if done {
			return n.itemsWithin(count)
		}
	}
}

// maxUniqueItems bounds the items of an array with uniqueItems that the
// one pass compares; longer ones go to the library.
const maxUniqueItems = 32

// itemKey is what makes an item equal to another for uniqueItems: a
// string's content, a literal, or a number's value.
type itemKey struct {
	kind byte // '"', 't', 'f', 'n' or '0'
	text []byte
	num  decimal
}

// keyOf returns the key of an item, given its JSON text, which the walker
// read; false for an item it does not compare (an object, an array, a
// string with escapes, a number it cannot hold exactly).
func keyOf(item []byte) (itemKey, bool) {
	switch c := item[0]; c {
	case '"':
		if bytes.IndexByte(item, '\\') >= 0 {
			return itemKey{}, false
		}
		return itemKey{kind: c, text: item[1 : len(item)-1]}, true
	case 't', 'f', 'n':
		return itemKey{kind: c}, true
	case '{', '[':
		return itemKey{}, false
	}
	r := walker{p: item}
	v, _, exact, ok := r.readNumber()
	return itemKey{kind: '0', num: v}, ok && exact && r.i == len(item)
}

func (k itemKey) equal(o itemKey) bool {
	if k.kind != o.kind {
		return false
	}
	switch k.kind {
	case '"':
		return bytes.Equal(k.text, o.text)
	case '0':
		return compareDecimal(k.num, o.num) == 0
	}
	return true
}

func (n *node) itemsWithin(count int) bool {
	return n.any || (n.minItems < 0 || count >= n.minItems) && (n.maxItems < 0 || count <= n.maxItems)
}

// str reads the string at w.i (its opening quote) and returns its
// content, unescaped, and its length in code points. It is not sure, and
// returns false, for what encoding/json would not take or would rewrite:
// a control character, invalid UTF-8, a lone surrogate.
func (w *walker) str() (s []byte, runes int, ok bool) {
	w.i++ // "
	start := w.i
	for w.i < len(w.p) {
		c := w.p[w.i]
		switch {
		case c == '"':
			s = w.p[start:w.i]
			w.i++
			return s, runes, true
		case c == '\\':
			return w.escaped(start, runes)
		case c < 0x20:
			return nil, 0, false
		case c < utf8.RuneSelf:
			w.i++
		default:
			r, size := utf8.DecodeRune(w.p[w.i:])
			if r == utf8.RuneError && size == 1 {
				return nil, 0, false
			}
			w.i += size
		}
		runes++
	}
	return nil, 0, false
}

// escaped goes on with a string that holds an escape at w.i, copying it
// unescaped into w.buf.
func (w *walker) escaped(start, runes int) ([]byte, int, bool) {
	w.buf = append(w.buf[:0], w.p[start:w.i]...)
	for w.i < len(w.p) {
		c := w.p[w.i]
		switch {
		case c == '"':
			w.i++
			return w.buf, runes, true
		case c < 0x20:
			return nil, 0, false
		case c == '\\':
			if w.i+1 >= len(w.p) {
				return nil, 0, false
			}
			e := w.p[w.i+1]
			w.i += 2
			switch e {
			case '"', '\\', '/':
				w.buf = append(w.buf, e)
			case 'b':
				w.buf = append(w.buf, '\b')
			case 'f':
				w.buf = append(w.buf, '\f')
			case 'n':
				w.buf = append(w.buf, '\n')
			case 'r':
				w.buf = append(w.buf, '\r')
			case 't':
				w.buf = append(w.buf, '\t')
			case 'u':
				r, ok := w.hex4()
				if !ok {
					return nil, 0, false
				}
				if utf16.IsSurrogate(r) {
					if w.i+1 >= len(w.p) || w.p[w.i] != '\\' || w.p[w.i+1] != 'u' {
						return nil, 0, false // lone: encoding/json rewrites it
					}
					w.i += 2
					r2, ok := w.hex4()
					if r = utf16.DecodeRune(r, r2); !ok || r == utf8.RuneError {
						return nil, 0, false
					}
				}
				w.buf = utf8.AppendRune(w.buf, r)
			default:
				return nil, 0, false
			}
		case c < utf8.RuneSelf:
			w.buf = append(w.buf, c)
			w.i++
		default:
			r, size := utf8.DecodeRune(w.p[w.i:])
			if r == utf8.RuneError && size == 1 {
				return nil, 0, false
			}
			w.buf = append(w.buf, w.p[w.i:w.i+size]...)
			w.i += size
		}
		runes++
	}
	return nil, 0, false
}

func (w *walker) hex4() (rune, bool) {
	if len(w.p)-w.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range w.p[w.i : w.i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	w.i += 4
	return r, true
}

// string checks a string value's content.
func (n *node) string(s []byte, runes int) bool {
	if n.any {
		return true
	}
	if n.hasEnum {
		found := false
		for _, e := range n.enumStrings {
			if string(s) == e {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	if n.minLen >= 0 && runes < n.minLen || n.maxLen >= 0 && runes > n.maxLen {
		return false
	}
	if n.pattern != nil && !n.pattern.MatchString(unsafeString(s)) {
		return false
	}
	// The library's formats check strings only: other values pass them.
	return n.format == nil || n.format.Validate(unsafeString(s)) == nil
}

// readNumber reads the number at w.i, as JSON's grammar has it: its value,
// whether it is written as an integer (no fraction, no exponent), and
// whether the value is exact (at most 19 significant digits that are not
// all zeros, an exponent within ±400). ok is false for text that is not a
// number.
func (w *walker) readNumber() (v decimal, integer, exact, ok bool) {
	p := w.p
	neg := p[w.i] == '-'
	if neg {
		w.i++
	}
	// value = mant × 10^exp, exact unless a digit past the 19th that is
	// not a zero had to be dropped
	var mant uint64
	digits, exp, inexact := 0, 0, false
	// keep adds a digit to mant and reports whether it did (false: it was
	// dropped); a leading zero counts as kept.
	keep := func(d byte) bool {
		if mant == 0 && d == '0' {
			return true
		}
		if digits++; digits <= 19 {
			mant = mant*10 + uint64(d-'0')
			return true
		}
		inexact = inexact || d != '0'
		return false
	}
	switch {
	case w.i < len(p) && p[w.i] == '0':
		w.i++
	case w.i < len(p) && p[w.i] >= '1' && p[w.i] <= '9':
		for w.i < len(p) && p[w.i] >= '0' && p[w.i] <= '9' {
			if !keep(p[w.i]) {
				exp++
			}
			w.i++
		}
	default:
		return decimal{}, false, false, false
	}
	integer = true
	if w.i < len(p) && p[w.i] == '.' {
		integer = false
		w.i++
		start := w.i
		for w.i < len(p) && p[w.i] >= '0' && p[w.i] <= '9' {
			if keep(p[w.i]) {
				exp--
			}
			w.i++
		}
		if w.i == start {
			return decimal{}, false, false, false
		}
	}
	if w.i < len(p) && (p[w.i] == 'e' || p[w.i] == 'E') {
		integer = false
		w.i++
		eneg := false
		if w.i < len(p) && (p[w.i] == '+' || p[w.i] == '-') {
			eneg = p[w.i] == '-'
			w.i++
		}
		start, e := w.i, 0
		for w.i < len(p) && p[w.i] >= '0' && p[w.i] <= '9' {
			if e < 10000 {
				e = e*10 + int(p[w.i]-'0')
			}
			w.i++
		}
		if w.i == start {
			return decimal{}, false, false, false
		}
		if eneg {
			e = -e
		}
		exp += e
	}
	exact = !inexact && exp <= 400 && exp >= -400
	if mant == 0 { // one zero, whatever its sign and exponent
		neg, exp = false, 0
	}
	return decimal{neg: neg, mant: mant, exp: exp}, integer, exact, true
}

// number reads the number at w.i and checks it against n: its type, and
// its enum, multipleOf and bounds compared exactly.
func (w *walker) number(n *node) bool {
	v, integer, exact, ok := w.readNumber()
	if !ok {
		return false
	}
	if n.any {
		return true
	}
	if !n.is(tNumber) && !(n.types&tInteger != 0 && integer) {
		return false // not a number it takes, or 1.0 or 1e2: the library decides
	}
	if !n.hasEnum && !n.min.set && !n.max.set && !n.exclMin.set && !n.exclMax.set && n.multipleOf == nil {
		return true
	}
	if !exact {
		return false // the library compares it
	}
	if n.hasEnum && !slices.ContainsFunc(n.enumNumbers, func(e decimal) bool { return compareDecimal(v, e) == 0 }) {
		return false
	}
	if n.multipleOf != nil && !multipleOf(v, *n.multipleOf) {
		return false
	}
	within := func(b bound, ok func(c int) bool) bool {
		return !b.set || ok(compareDecimal(v, b.v))
	}
	return within(n.min, func(c int) bool { return c >= 0 }) &&
		within(n.max, func(c int) bool { return c <= 0 }) &&
		within(n.exclMin, func(c int) bool { return c > 0 }) &&
		within(n.exclMax, func(c int) bool { return c < 0 })
}

// compareDecimal compares a with b, exactly.
func compareDecimal(a, b decimal) int {
	sa, sb := a.sign(), b.sign()
	if sa != sb {
		return cmp.Compare(sa, sb)
	}
	if sa == 0 {
		return 0
	}
	// compare the magnitudes, then apply the sign
	if a.exp >= b.exp {
		x, ok := scale(a.mant, a.exp-b.exp)
		if !ok { // past uint64, so past b.mant
			return sa
		}
		return sa * cmp.Compare(x, b.mant)
	}
	y, ok := scale(b.mant, b.exp-a.exp)
	if !ok {
		return -sa
	}
	return sa * cmp.Compare(a.mant, y)
}

func (d decimal) sign() int {
	switch {
	case d.mant == 0:
		return 0
	case d.neg:
		return -1
	}
	return 1
}

// decimalOf returns r as a decimal, or false when it has no exact one
// (a fraction like 1/3, more than 19 significant digits, or an exponent
// past ±400).
func decimalOf(r *big.Rat) (decimal, bool) {
	num, den := new(big.Int).Abs(r.Num()), new(big.Int).Set(r.Denom())
	ten, rem := big.NewInt(10), new(big.Int)
	exp := 0
	for den.Cmp(big.NewInt(1)) != 0 {
		if exp < -400 {
			return decimal{}, false
		}
		num.Mul(num, ten)
		exp--
		g := new(big.Int).GCD(nil, nil, num, den)
		num.Quo(num, g)
		den.Quo(den, g)
	}
	for num.Sign() != 0 {
		q, m := new(big.Int).QuoRem(num, ten, rem)
		if m.Sign() != 0 {
			break
		}
		num = q
		exp++
	}
	if !num.IsUint64() || num.Uint64() > 9_999_999_999_999_999_999 || exp > 400 {
		return decimal{}, false
	}
	return decimal{neg: r.Sign() < 0, mant: num.Uint64(), exp: exp}, true
}

// multipleOf reports whether v is an integer multiple of d (not 0), or
// false when it cannot tell exactly.
func multipleOf(v, d decimal) bool {
	e := min(v.exp, d.exp)
	a, ok1 := scale(v.mant, v.exp-e)
	b, ok2 := scale(d.mant, d.exp-e)
	return ok1 && ok2 && a%b == 0
}

// scale returns v × 10^n, or false when that passes the uint64 range.
func scale(v uint64, n int) (uint64, bool) {
	for range n {
		if v > math.MaxUint64/10 {
			return 0, false
		}
		v *= 10
	}
	return v, true
}

// unsafeString views b as a string for a lookup or a match that does not
// keep it.
func unsafeString(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}
