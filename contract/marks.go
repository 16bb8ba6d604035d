package contract

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The annotations a schema marks a field with, on the field's own schema:
//
//	"email": {"type": "string", "x-sensitive": true}
//	"card":  {"type": "object", "x-forbidden": true}
//
// x-sensitive adds the field's path to the contract's Sensitive paths,
// x-forbidden to its Forbidden ones, as the index's "sensitive" and
// "forbidden" do. JSON Schema's own writeOnly: true counts as
// x-sensitive: a value that is written but never read back is not shown.
const (
	SensitiveKeyword = "x-sensitive"
	ForbiddenKeyword = "x-forbidden"
)

// marksURL names the vocabulary of the two annotations; it is never
// fetched.
const marksURL = "urn:outbox:contract:marks"

// mark is the compiled form of a schema's annotations. It asserts nothing:
// the annotations change what is masked and refused, not what validates.
type mark struct{ sensitive, forbidden bool }

func (*mark) Validate(*jsonschema.ValidatorContext, any) {}

// marksVocabulary checks that the annotations are booleans (a schema with
// "x-sensitive": "yes" does not load) and compiles them into a mark.
func marksVocabulary() *jsonschema.Vocabulary {
	meta := map[string]any{"properties": map[string]any{
		SensitiveKeyword: map[string]any{"type": "boolean"},
		ForbiddenKeyword: map[string]any{"type": "boolean"},
	}}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(marksURL, meta); err != nil {
		panic(err) // a constant document
	}
	sch, err := c.Compile(marksURL)
	if err != nil {
		panic(err)
	}
	return &jsonschema.Vocabulary{URL: marksURL, Schema: sch, Compile: func(_ *jsonschema.CompilerContext, obj map[string]any) (jsonschema.SchemaExt, error) {
		s, _ := obj[SensitiveKeyword].(bool)
		f, _ := obj[ForbiddenKeyword].(bool)
		if !s && !f {
			return nil, nil
		}
		return &mark{sensitive: s, forbidden: f}, nil
	}}
}

type marked struct{ sensitive, forbidden []string }

// maxMarkDepth bounds the paths marks follows into a schema.
const maxMarkDepth = 32

// marks returns the payload paths a compiled schema marks sensitive or
// forbidden, following properties (a segment per name), items and
// additional or pattern properties (*), tuple items (their index), and
// $ref, allOf, anyOf, oneOf, if/then/else (the same path). A recursive
// schema is followed until it repeats: the marks of one level of it.
func marks(root *jsonschema.Schema) (marked, error) {
	var m marked
	var walk func(s *jsonschema.Schema, path []string, on []*jsonschema.Schema) error
	walk = func(s *jsonschema.Schema, path []string, on []*jsonschema.Schema) error {
		if s == nil || slices.Contains(on, s) || len(path) > maxMarkDepth {
			return nil
		}
		on = append(on, s)
		sensitive := s.WriteOnly
		forbidden := false
		for _, ext := range s.Extensions {
			if mk, ok := ext.(*mark); ok {
				sensitive = sensitive || mk.sensitive
				forbidden = forbidden || mk.forbidden
			}
		}
		if sensitive || forbidden {
			if len(path) == 0 {
				return errors.New("the whole payload is marked sensitive or forbidden: mark its fields")
			}
			p := strings.Join(path, ".")
			if sensitive {
				m.sensitive = append(m.sensitive, p)
			}
			if forbidden {
				m.forbidden = append(m.forbidden, p)
			}
		}
		child := func(c *jsonschema.Schema, seg string) error {
			if seg == "" {
				return walk(c, path, on)
			}
			if strings.Contains(seg, ".") {
				return nil // a name our paths cannot spell; mark it in the index with *
			}
			return walk(c, append(path[:len(path):len(path)], seg), on)
		}
		var errs []error
		add := func(err error) { errs = append(errs, err) }
		for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
			add(child(s.Properties[name], name))
		}
		for _, c := range s.PatternProperties {
			add(child(c, "*"))
		}
		if c, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
			add(child(c, "*"))
		}
		add(child(s.UnevaluatedProperties, "*"))
		switch items := s.Items.(type) {
		case *jsonschema.Schema:
			add(child(items, "*"))
		case []*jsonschema.Schema:
			for i, c := range items {
				add(child(c, strconv.Itoa(i)))
			}
		}
		if c, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
			add(child(c, "*"))
		}
		for i, c := range s.PrefixItems {
			add(child(c, strconv.Itoa(i)))
		}
		add(child(s.Items2020, "*"))
		add(child(s.UnevaluatedItems, "*"))
		add(child(s.Ref, ""))
		add(child(s.RecursiveRef, ""))
		if s.DynamicRef != nil {
			add(child(s.DynamicRef.Ref, ""))
		}
		for _, list := range [][]*jsonschema.Schema{s.AllOf, s.AnyOf, s.OneOf, {s.If, s.Then, s.Else}} {
			for _, c := range list {
				add(child(c, ""))
			}
		}
		for _, c := range s.DependentSchemas {
			add(child(c, ""))
		}
		return errors.Join(errs...)
	}
	if err := walk(root, nil, nil); err != nil {
		return marked{}, fmt.Errorf("%s/%s: %w", SensitiveKeyword, ForbiddenKeyword, err)
	}
	slices.Sort(m.sensitive)
	slices.Sort(m.forbidden)
	m.sensitive = slices.Compact(m.sensitive)
	m.forbidden = slices.Compact(m.forbidden)
	return m, nil
}
