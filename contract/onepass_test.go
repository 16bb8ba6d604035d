package contract

import (
	"bytes"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// compileSchema compiles one schema document as Load does.
func compileSchema(t testing.TB, doc string) *jsonschema.Schema {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
	if err != nil {
		t.Fatalf("schema %s: %v", doc, err)
	}
	comp := newCompiler()
	if err := comp.AddResource("schema.json", v); err != nil {
		t.Fatal(err)
	}
	s, err := comp.Compile("schema.json")
	if err != nil {
		t.Fatalf("schema %s: %v", doc, err)
	}
	return s
}

// libraryValid is the verdict of the slow path: decode, then the library.
func libraryValid(s *jsonschema.Schema, payload []byte) bool {
	doc, err := decode(payload)
	return err == nil && s.Validate(doc) == nil
}

// numbersUpTo returns "0, 1, ..., n-1".
func numbersUpTo(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return strings.Join(s, ", ")
}

// onePassCases are, per schema, payloads both verdicts take (valid), both
// refuse (invalid), and payloads the library takes but the one pass is not
// sure of (deferred): it says no, and the library decides.
var onePassCases = []struct {
	name, schema             string
	valid, invalid, deferred []string
}{
	{
		name:     "types",
		schema:   `{"type": "object", "properties": {"n": {"type": "null"}, "b": {"type": "boolean"}, "x": {"type": "number"}, "i": {"type": "integer"}, "s": {"type": "string"}, "a": {"type": "array"}, "o": {"type": "object"}, "m": {"type": ["string", "null"]}}}`,
		valid:    []string{`{}`, `{"n": null, "b": true, "x": 1.5, "i": -3, "s": "", "a": [], "o": {}, "m": null}`, `{"b": false, "x": -0, "i": 4611686018427387904, "m": "x"}`, ` { "x" : 1e400 } `, `{"i": -0}`},
		invalid:  []string{`[]`, `"s"`, `{"n": 0}`, `{"b": "true"}`, `{"x": "1"}`, `{"i": 1.5}`, `{"s": 1}`, `{"a": {}}`, `{"o": []}`, `{"m": 1}`, `{"i": true}`},
		deferred: []string{`{"i": 1.0}`, `{"i": 1e2}`, `{"i": 10E-1}`},
	},
	{
		name:    "enum and const",
		schema:  `{"properties": {"e": {"enum": ["a", "b", null, true]}, "c": {"const": "only"}, "f": {"const": false}}}`,
		valid:   []string{`{"e": "a"}`, `{"e": "b", "c": "only", "f": false}`, `{"e": null}`, `{"e": true}`, `{"c": "\u006fnly"}`},
		invalid: []string{`{"e": "c"}`, `{"e": false}`, `{"e": 1}`, `{"e": ["a"]}`, `{"c": "Only"}`, `{"f": true}`, `{"f": null}`, `{"e": "a "}`},
	},
	{
		name:     "string length and pattern",
		schema:   `{"properties": {"s": {"minLength": 2, "maxLength": 3}, "p": {"pattern": "^[A-Z]{3}-[0-9]{2}$"}, "q": {"pattern": "é"}}}`,
		valid:    []string{`{"s": "ab"}`, `{"s": "abc"}`, `{"s": "éé"}`, `{"s": "日本語"}`, `{"s": "\u00e9\n"}`, `{"s": "😀😀"}`, `{"s": "\ud83d\ude00\ud83d\ude00"}`, `{"p": "ABC-12"}`, `{"p": "\u0041BC-12"}`, `{"q": "café"}`, `{"q": "caf\u00e9"}`, `{"s": 5}`, `{"s": "a\u0000"}`},
		invalid:  []string{`{"s": "a"}`, `{"s": "abcd"}`, `{"s": "éééé"}`, `{"s": "\u00e9"}`, `{"p": "ABC-123"}`, `{"p": "abc-12"}`, `{"p": "ABC-1\n"}`, `{"q": "cafe"}`, `{"s": "\u0000"}`},
		deferred: []string{},
	},
	{
		name:    "integer bounds",
		schema:  `{"properties": {"min": {"minimum": 0}, "max": {"maximum": 1000}, "emin": {"exclusiveMinimum": -5}, "emax": {"exclusiveMaximum": 10}, "lo": {"minimum": -9223372036854775808}, "hi": {"maximum": 9223372036854775807}}}`,
		valid:   []string{`{"min": 0}`, `{"min": -0}`, `{"min": 0.0}`, `{"min": 1e-5}`, `{"min": 12.5}`, `{"max": 1000}`, `{"max": 999.999}`, `{"max": 1e3}`, `{"max": 10E2}`, `{"max": 1000.000}`, `{"max": -1e300}`, `{"emin": -4.99}`, `{"emin": 0}`, `{"emax": 9.999}`, `{"emax": -10}`, `{"lo": -9223372036854775808}`, `{"hi": 9223372036854775807}`, `{"max": 0.000000000000000000000001}`, `{"min": "-1"}`},
		invalid: []string{`{"min": -0.001}`, `{"min": -1}`, `{"min": -1e-300}`, `{"max": 1000.0001}`, `{"max": 1001}`, `{"max": 1.0001e3}`, `{"max": 100000000000000000000}`, `{"max": 1e300}`, `{"emin": -5}`, `{"emin": -5.0}`, `{"emin": -6}`, `{"emax": 10}`, `{"emax": 10.0}`, `{"emax": 1e1}`, `{"lo": -9223372036854775809}`, `{"hi": 9223372036854775808}`},
		// more than 19 significant digits, or past the exponents it
		// compares: exact, but the one pass leaves it to the library
		deferred: []string{`{"max": 999.99999999999999999999}`, `{"min": 1e-500}`, `{"hi": 1.2345678901234567890123}`},
	},
	{
		name:    "decimal bounds and numbers in enum and const",
		schema:  `{"properties": {"price": {"exclusiveMinimum": 0, "maximum": 99.99}, "rate": {"minimum": -0.5, "exclusiveMaximum": 1e-3}, "big": {"minimum": 1e30}, "e": {"enum": [1, 2.5, "a", null]}, "c": {"const": 0}, "v": {"type": "integer", "enum": [1, 2]}}}`,
		valid:   []string{`{"price": 0.01, "rate": -0.5, "big": 1e30, "e": 1, "c": 0, "v": 2}`, `{"price": 99.99, "rate": 0.000999, "big": 1000000000000000000000000000000}`, `{"price": 99.990, "e": 2.50, "c": -0, "v": 1}`, `{"e": 25e-1, "c": 0.0, "big": 10e29}`, `{"e": "a"}`, `{"e": null}`, `{"e": 1.0}`, `{"e": 1.00000000000000000000000}`, `{"big": 1000000000000000000000000000000.000000000000000}`},
		invalid: []string{`{"price": 0}`, `{"price": 99.99000000000000000000001}`, `{"price": 99.991}`, `{"price": 1e2}`, `{"rate": -0.50001}`, `{"rate": 0.001}`, `{"rate": 1e-3}`, `{"big": 9.99999e29}`, `{"e": 2}`, `{"e": 2.49}`, `{"e": "b"}`, `{"e": true}`, `{"c": 1e-400}`, `{"c": 1}`, `{"v": 3}`, `{"v": 1.5}`},
		// past 19 significant digits that are not all zeros: the library
		// compares them
		deferred: []string{`{"price": 99.98999999999999999999999}`, `{"v": 1.0}`},
	},
	{
		name:     "allOf, anyOf, $ref beside other keywords, multipleOf",
		schema:   `{"$defs": {"money": {"type": "number", "multipleOf": 0.01, "minimum": 0}, "named": {"type": "object", "required": ["name"]}}, "properties": {"note": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]}, "price": {"$ref": "#/$defs/money", "maximum": 100}, "both": {"allOf": [{"$ref": "#/$defs/named"}, {"required": ["id"]}], "properties": {"id": {"type": "integer", "multipleOf": 3}}}, "either": {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"a": {"anyOf": [{"type": "boolean"}, {"type": "string"}]}}}]}}}`,
		valid:    []string{`{"note": "abc", "price": 99.99, "both": {"name": "x", "id": 3}, "either": 7}`, `{"note": null, "price": 0, "either": {"a": true}}`, `{"price": 100, "both": {"name": 1, "id": -6}, "either": {"a": "s"}}`, `{"price": 1e-2, "either": {}}`, `{"price": 12.300}`, `{"price": 12.340000000000000000000000}`},
		invalid:  []string{`{"note": "abcd"}`, `{"note": 1}`, `{"price": 100.01}`, `{"price": 0.001}`, `{"price": 12.345}`, `{"price": -0.01}`, `{"both": {"name": "x"}}`, `{"both": {"id": 3}}`, `{"both": {"name": "x", "id": 4}}`, `{"either": 1.5}`, `{"either": {"a": 1}}`, `{"either": "s"}`},
		deferred: []string{`{"both": {"name": "x", "id": 3.0}}`},
	},
	{
		// Every level tries the first schema, which reads the whole
		// nesting below before minItems fails, then the second: 2^depth
		// visits. The one pass stops at its budget of visits and leaves
		// the payload to the library (which takes exponential time on this
		// schema too: 0.4 s at depth 15, 16 s at 20, so the depth is small).
		name:     "anyOf within a budget",
		schema:   `{"$defs": {"t": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/t"}, "minItems": 2}, {"type": "array", "items": {"$ref": "#/$defs/t"}}, {"type": "integer"}]}}, "$ref": "#/$defs/t"}`,
		valid:    []string{`[[1, 2], [[3]]]`},
		invalid:  []string{`[[1, "2"]]`},
		deferred: []string{strings.Repeat("[", 12) + "1" + strings.Repeat("]", 12)},
	},
	{
		name:     "uniqueItems",
		schema:   `{"properties": {"u": {"type": "array", "uniqueItems": true}, "s": {"type": "array", "uniqueItems": true, "items": {"type": "string"}}}}`,
		valid:    []string{`{"u": []}`, `{"u": ["a", "b", "A"]}`, `{"u": [1, 2.5, "1", true, false, null, 0, "0"]}`, `{"u": [1, 10, 0.1, -1]}`, `{"s": ["x", "y"]}`, `{"u": [ "a" , "b" ]}`},
		invalid:  []string{`{"u": ["a", "a"]}`, `{"u": [1, 1.0]}`, `{"u": [1, 1e0]}`, `{"u": [10, 1e1]}`, `{"u": [0, -0]}`, `{"u": [0, 0.0e5]}`, `{"u": [true, true]}`, `{"u": [null, null]}`, `{"u": ["a", "\u0061"]}`, `{"s": ["x", 1]}`, `{"u": [{"a": 1}, {"a": 1}]}`},
		deferred: []string{`{"u": [{"a": 1}, {"a": 2}]}`, `{"u": [[1], [2]]}`, `{"u": ["\u0061", "b"]}`, `{"u": [1.00000000000000000000001, 1]}`, `{"u": [` + numbersUpTo(maxUniqueItems+1) + `]}`},
	},
	{
		name:     "objects",
		schema:   `{"type": "object", "required": ["a", "z"], "additionalProperties": false, "properties": {"a": {"type": "integer"}, "b": {"type": "object", "additionalProperties": {"type": "string"}, "properties": {"k": {"type": "integer"}}}, "z": true, "no": false}}`,
		valid:    []string{`{"a": 1, "z": null}`, `{"z": [1, {"x": "y"}], "a": 2, "b": {}}`, `{"a": 1, "z": 0, "b": {"k": 1, "other": "s"}}`, `{"\u0061": 1, "z": 0}`, `{"a": 1, "a": 2, "z": 0}`},
		invalid:  []string{`{}`, `{"a": 1}`, `{"z": 1}`, `{"a": 1, "z": 0, "c": 1}`, `{"a": 1, "z": 0, "no": 1}`, `{"a": 1, "z": 0, "b": {"other": 1}}`, `{"a": 1, "z": 0, "b": {"k": "s"}}`, `{"a": "1", "z": 0}`, `{"a": 1, "a": "2", "z": 0}`},
		deferred: []string{`{"a": "1", "a": 2, "z": 0}`},
	},
	{
		name:    "a required name without a property schema",
		schema:  `{"required": ["r"], "additionalProperties": {"type": "string"}}`,
		valid:   []string{`{"r": "x"}`, `{"r": "x", "s": "y"}`, `5`},
		invalid: []string{`{}`, `{"r": 1}`, `{"s": "y"}`},
	},
	{
		name:    "arrays",
		schema:  `{"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "required": ["q"], "properties": {"q": {"type": "integer", "minimum": 1}}}}`,
		valid:   []string{`[{"q": 1}]`, `[{"q": 1}, {"q": 2, "x": [[[]]]}, {"q": 3}]`},
		invalid: []string{`[]`, `[{"q": 1}, {"q": 1}, {"q": 1}, {"q": 1}]`, `[{"q": 0}]`, `[{}]`, `[1]`, `{"q": 1}`},
	},
	{
		name:    "refs, recursion and the marks",
		schema:  `{"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}, "secret": {"type": "string", "x-sensitive": true}}, "type": "object", "properties": {"tree": {"$ref": "#/$defs/node"}, "s": {"$ref": "#/$defs/secret", "description": "an annotation beside the $ref"}}}`,
		valid:   []string{`{"tree": {"v": 1, "kids": [{"v": 2, "kids": []}, {"kids": [{"v": 3}]}]}, "s": "x"}`},
		invalid: []string{`{"tree": {"v": 1, "kids": [{"v": 2, "kids": [{"v": "3"}]}]}}`, `{"s": 1}`, `{"tree": []}`},
	},
	{
		name:    "asserted formats (draft 7)",
		schema:  `{"$schema": "http://json-schema.org/draft-07/schema#", "properties": {"e": {"type": "string", "format": "email"}, "t": {"format": "date-time"}, "u": {"format": "uuid"}, "x": {"format": "no-such-format"}}}`,
		valid:   []string{`{"e": "someone@example.com", "t": "2026-03-01T12:34:56.789Z", "u": "0190f5a2-7c4e-7b3a-9d2e-5f6a7b8c9d0e", "x": "anything"}`, `{"t": 5, "u": null}`, `{"e": "some\u006fne@example.com"}`},
		invalid: []string{`{"e": "someone"}`, `{"e": "someone@"}`, `{"t": "2026-03-01"}`, `{"t": "2026-13-01T12:34:56Z"}`, `{"u": "0190f5a2"}`, `{"e": 5}`},
	},
	{
		name:    "false schema",
		schema:  `false`,
		invalid: []string{`{}`, `null`, `1`},
	},
	{
		name:    "true schema and JSON's grammar",
		schema:  `true`,
		valid:   []string{`{}`, ` [ ] `, `"\"\\\/\b\f\n\r\t\u0000\uFFFF"`, `-0.5e+10`, `0`, `{"a": [1, "x", null, true, false, {"b": {}}]}`, "\"\xef\xbf\xbd\""},
		invalid: []string{``, ` `, `{`, `{"a": 1,}`, `[1 2]`, `[1,]`, `01`, `1.`, `.5`, `-`, `+1`, `1e`, `1e+`, `"a`, "\"\x01\"", `"\x"`, `"\u12"`, `"\u12G4"`, `{} x`, `{a: 1}`, `tru`, `nulls`, `[1]]`, `{"a" 1}`, `NaN`, "\xef\xbb\xbf{}"},
		// encoding/json takes these but rewrites them (invalid UTF-8, lone
		// surrogates), and nesting deeper than the one pass follows
		deferred: []string{"\"\xff\"", `"\ud800"`, `"\udc00\ud800"`, `"\ud800\u0041"`, strings.Repeat("[", 300) + strings.Repeat("]", 300)},
	},
}

func TestOnePassAgreesWithTheLibrary(t *testing.T) {
	for _, c := range onePassCases {
		t.Run(c.name, func(t *testing.T) {
			s := compileSchema(t, c.schema)
			o := newOnePass(s)
			if o == nil {
				t.Fatalf("no one-pass check for %s", c.schema)
			}
			for _, p := range c.valid {
				if !libraryValid(s, []byte(p)) {
					t.Errorf("the library refuses %s: fix the case", p)
				}
				if !o.accepts([]byte(p)) {
					t.Errorf("the one pass refuses %s, which is valid", p)
				}
			}
			for _, p := range c.invalid {
				if libraryValid(s, []byte(p)) {
					t.Errorf("the library takes %s: fix the case", p)
				}
				if o.accepts([]byte(p)) {
					t.Errorf("the one pass takes %s, which is invalid", p)
				}
			}
			for _, p := range c.deferred {
				if !libraryValid(s, []byte(p)) {
					t.Errorf("the library refuses %s: fix the case", p)
				}
				if o.accepts([]byte(p)) {
					t.Errorf("the one pass takes %s, which it should leave to the library", p)
				}
			}
		})
	}
}

// TestSchemasBeyondTheOnePassGoToTheLibrary: a schema that uses a keyword
// the one pass does not take anywhere, even deep inside, has none, and
// Check still gives the library's verdicts.
func TestSchemasBeyondTheOnePassGoToTheLibrary(t *testing.T) {
	for _, c := range []struct{ doc, why string }{
		{`{"anyOf": [{"type": "string"}, {"oneOf": [{"type": "integer"}]}]}`, "oneOf at schema.json#/anyOf/1"},
		{`{"properties": {"a": {"properties": {"b": {"allOf": [{"not": {"minimum": 1}}]}}}}}`, "not at schema.json#/properties/a/properties/b/allOf/0"},
		{`{"properties": {"a": {"oneOf": [true]}}}`, "oneOf at schema.json#/properties/a"},
		{`{"not": {"type": "null"}}`, "not at"},
		{`{"if": {"type": "string"}, "then": {"minLength": 1}}`, "if at"},
		{`{"patternProperties": {"^x": {"type": "string"}}}`, "patternProperties at"},
		{`{"propertyNames": {"maxLength": 3}}`, "propertyNames at"},
		{`{"minProperties": 1}`, "minProperties at"},
		{`{"dependentRequired": {"a": ["b"]}}`, "dependentRequired at"},
		{`{"unevaluatedProperties": false}`, "unevaluatedProperties at"},
		{`{"items": {"patternProperties": {"^a": true}}}`, "patternProperties at schema.json#/items"},
		{`{"contains": {"type": "string"}}`, "contains at"},
		{`{"prefixItems": [{"type": "string"}]}`, "prefixItems at"},
		{`{"multipleOf": 0.33333333333333333333333}`, "a multipleOf that is not a decimal of at most 19 significant digits"},
		{`{"minimum": 0.33333333333333333333333}`, "a bound that is not a decimal of at most 19 significant digits (33333333333333333333333/100000000000000000000000) at"},
		{`{"maximum": 1e-500}`, "a bound that is not a decimal of at most 19 significant digits"},
		{`{"enum": [1, 12345678901234567890123]}`, "enum or const with a number of more than 19 significant digits (12345678901234567890123)"},
		{`{"const": {"a": 1}}`, "enum or const with a value of type map[string]interface {}"},
		{`{"$schema": "http://json-schema.org/draft-07/schema#", "properties": {"r": {"format": "regex"}}}`, "format regex at schema.json#/properties/r"},
		{`{"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]}`, "items with a schema per position at"},
		{`{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "properties": {"x": {"$ref": "#/$defs/a"}}}`, "a cycle of $refs at schema.json#/"},
	} {
		o, why := buildOnePass(compileSchema(t, c.doc))
		if o != nil || !strings.Contains(why, c.why) {
			t.Errorf("%s: one pass %v, why %q; want none, because %q", c.doc, o != nil, why, c.why)
		}
	}
	dir := t.TempDir()
	index := `{"contracts": [{"aggregatetype": "a", "type": "T", "version": 1, "schema": "t.json"}]}`
	schema := `{"type": "object", "properties": {"n": {"not": {"const": 3}}}}`
	if err := os.WriteFile(dir+"/"+IndexFile, []byte(index), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/t.json", []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := r.Lookup("a", "T", "")
	if ok, why := c.OnePass(); ok || why != "not at t.json#/properties/n" {
		t.Fatalf("OnePass: %v, %q", ok, why)
	}
	bench, err := Load("testdata/bench")
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := bench.Contracts()[0].OnePass(); !ok || why != "" {
		t.Fatalf("the bench contract: OnePass %v, %q", ok, why)
	}
	if _, err := r.Check("a", "T", "", []byte(`{"n": 4}`), false); err != nil {
		t.Fatalf("valid: %v", err)
	}
	if _, err := r.Check("a", "T", "", []byte(`{"n": 3}`), false); err == nil || !strings.Contains(err.Error(), "at /n: fails") {
		t.Fatalf("invalid: %v", err)
	}
}

// TestOnePassFindsForbiddenPaths: a payload holding a forbidden path, at
// any depth, through * and array indexes, is never taken by the one pass.
func TestOnePassFindsForbiddenPaths(t *testing.T) {
	o := newOnePass(compileSchema(t, `{"type": "object"}`))
	forbidden := [][]string{{"card", "token"}, {"cards", "*", "number"}, {"items", "1"}}
	for p, holds := range map[string]bool{
		`{"card": {"brand": "x"}, "cards": [{"brand": "y"}], "items": [1]}`: false,
		`{"card": {"token": null}}`:                                         true,
		`{"card": {"brand": "x", "token": "t"}}`:                            true,
		`{"c\u0061rd": {"token": "t"}}`:                                     true,
		`{"cards": [{"brand": "y"}, {"number": "4111"}]}`:                   true,
		`{"cards": {"visa": {"number": "4111"}}}`:                           true,
		`{"items": [1, 2]}`:                                                 true,
		`{"other": {"card": {"token": "t"}}}`:                               false,
		`{"card": "token"}`:                                                 false,
		`{"card": {"token": 1}, "card": {"brand": "last wins"}}`:            true, // left to the library, which decides on the last
	} {
		if got := o.accepts([]byte(p), forbidden); got == holds {
			t.Errorf("%s: the one pass takes it: %v; it holds a forbidden path: %v", p, got, holds)
		}
		doc, err := decode([]byte(p))
		if err != nil {
			t.Fatal(err)
		}
		if lib := forbiddenIn(doc, forbidden) != nil; lib != holds && !strings.Contains(p, "last wins") {
			t.Errorf("%s: the library's walk says %v", p, lib)
		}
	}
}

// FuzzOnePassNeverAcceptsWhatTheLibraryRefuses checks the one pass's one
// promise: whatever it takes, the library takes too, with the forbidden
// paths absent. The schemas are the bench contract and those of the
// cases above; the first byte of an input picks one.
func FuzzOnePassNeverAcceptsWhatTheLibraryRefuses(f *testing.F) {
	bench, err := os.ReadFile("testdata/bench/order/OrderPlaced.v1.json")
	if err != nil {
		f.Fatal(err)
	}
	docs := []string{string(bench)}
	for _, c := range onePassCases {
		docs = append(docs, c.schema)
	}
	var schemas []*jsonschema.Schema
	var passes []*onePass
	for _, d := range docs {
		s := compileSchema(f, d)
		schemas, passes = append(schemas, s), append(passes, newOnePass(s))
	}
	forbidden := [][]string{{"card", "token"}, {"lines", "*", "secret"}, {"tree", "kids", "0", "v"}}
	order := orderPayload(f)
	f.Add(append([]byte{0}, order...))
	f.Add(append([]byte{0}, bytes.Replace(order, []byte(`"qty": 1,`), []byte(`"qty": 1, "secret": 1,`), 1)...))
	for i, c := range onePassCases {
		for _, ps := range [][]string{c.valid, c.invalid, c.deferred} {
			for _, p := range ps {
				f.Add(append([]byte{byte(i + 1)}, p...))
			}
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		i, p := int(in[0])%len(docs), in[1:]
		if !passes[i].accepts(p, forbidden) {
			return
		}
		doc, err := decode(p)
		if err != nil {
			t.Fatalf("schema %d: the one pass takes %q, which does not parse: %v", i, p, err)
		}
		if err := schemas[i].Validate(doc); err != nil {
			t.Fatalf("schema %d: the one pass takes %q, which the library refuses: %v", i, p, err)
		}
		if err := forbiddenIn(doc, forbidden); err != nil {
			t.Fatalf("schema %d: the one pass takes %q: %v", i, p, err)
		}
	})
}

// TestCompareDecimalIsExact compares compareDecimal with math/big over
// the edges (zero, the largest mantissas, uint64 overflow on either side
// when the exponents are aligned) and 50,000 random pairs of decimals,
// and decimalOf's conversions back.
func TestCompareDecimalIsExact(t *testing.T) {
	rat := func(d decimal) *big.Rat {
		v := new(big.Rat).SetInt(new(big.Int).SetUint64(d.mant))
		p := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(max(d.exp, -d.exp))), nil))
		if d.exp >= 0 {
			v.Mul(v, p)
		} else {
			v.Quo(v, p)
		}
		if d.neg {
			v.Neg(v)
		}
		return v
	}
	compare := func(a, b decimal, ra, rb *big.Rat) {
		t.Helper()
		if got, w := compareDecimal(a, b), ra.Cmp(rb); got != w {
			t.Fatalf("compareDecimal(%+v, %+v) = %d, want %d", a, b, got, w)
		}
	}
	roundTrip := func(a decimal, ra *big.Rat) {
		t.Helper()
		if d, ok := decimalOf(ra); ok && rat(d).Cmp(ra) != 0 {
			t.Fatalf("decimalOf(%s) = %+v", ra.RatString(), d)
		}
	}
	var edges []decimal
	for _, mant := range []uint64{0, 1, 9, 10, 1e18, 9_999_999_999_999_999_999, math.MaxUint64} {
		for _, exp := range []int{-400, -20, -19, -1, 0, 1, 2, 19, 20, 400} {
			edges = append(edges, decimal{false, mant, exp}, decimal{true, mant, exp})
		}
	}
	rats := make([]*big.Rat, len(edges))
	for i, e := range edges {
		rats[i] = rat(e)
		roundTrip(e, rats[i])
	}
	for i, a := range edges {
		for j, b := range edges {
			compare(a, b, rats[i], rats[j])
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	random := func() decimal {
		return decimal{neg: rng.IntN(2) == 0, mant: rng.Uint64() >> rng.IntN(64), exp: rng.IntN(50) - 25}
	}
	for range 50_000 {
		a := random()
		b := a
		if rng.IntN(4) > 0 { // else equal values, written alike or not
			b = random()
		} else if b.mant%10 == 0 && b.mant > 0 {
			b.mant, b.exp = b.mant/10, b.exp+1
		}
		ra := rat(a)
		compare(a, b, ra, rat(b))
		roundTrip(a, ra)
	}
	for _, c := range []struct {
		r    string
		want decimal
		ok   bool
	}{
		{"0", decimal{}, true}, {"-0.5", decimal{true, 5, -1}, true}, {"99.99", decimal{false, 9999, -2}, true},
		{"1e30", decimal{false, 1, 30}, true}, {"-9223372036854775808", decimal{true, 9223372036854775808, 0}, true},
		{"1/3", decimal{}, false}, {"12345678901234567890123", decimal{}, false}, {"1e-500", decimal{}, false},
	} {
		r, _ := new(big.Rat).SetString(c.r)
		if d, ok := decimalOf(r); ok != c.ok || ok && d != c.want {
			t.Errorf("decimalOf(%s) = %+v, %v; want %+v, %v", c.r, d, ok, c.want, c.ok)
		}
	}
}
