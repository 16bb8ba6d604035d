// Package apilist lists the exported API of a module's public packages, one
// line per exported item, in the format of the Go distribution's
// api/go1.*.txt files. The module keeps one listing file per public package
// under api/ at its root, and a test compares them with the code, so that
// every change of the exported API is deliberate and shows in review
// (docs/api.md).
//
// A public package is a package of the module with at least one non-test Go
// file, whose name is not main, whose import path has no "internal" element,
// and whose path below the module does not start with cmd/ or examples/.
package apilist

import (
	"bytes"
	"errors"
	"fmt"
	"go/build/constraint"
	"go/types"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"

	"github.com/outboxkit/outbox/internal/gobuild"
)

// Listing is the exported API of one public package.
type Listing struct {
	// Path is the package's import path.
	Path string
	// Name names the package in each line: its path below the module, or
	// for the module's root package the last element of the module path
	// (before any major version suffix).
	Name string
	// File is the name of the package's listing file under api/ (FileName).
	File string
	// Lines are the exported items, one a line, sorted.
	Lines []string
}

// Generate loads every package of the module whose root directory is dir,
// and returns the listings of its public packages, sorted by import path.
// It fails when a package does not build, or when a public package has a
// non-test Go file that build constraints exclude here (its listing would
// then depend on the machine that makes it).
func Generate(dir string) ([]Listing, error) {
	cfg := &packages.Config{
		Dir:  dir,
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedTypes | packages.NeedModule,
		// The types come from export data, which go list compiles: as
		// internal/gobuild builds, so that the compile is shared.
		Env:        gobuild.Environ(),
		BuildFlags: gobuild.Flags,
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, fmt.Errorf("apilist: loading the packages of %s: %w", dir, err)
	}
	var errs []error
	for _, p := range pkgs {
		for _, e := range p.Errors {
			errs = append(errs, fmt.Errorf("apilist: %s: %s", p.PkgPath, e))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	module := ""
	for _, p := range pkgs {
		if p.Module == nil || !p.Module.Main {
			return nil, fmt.Errorf("apilist: package %s is not in the main module of %s", p.PkgPath, dir)
		}
		if module == "" {
			module = p.Module.Path
		} else if p.Module.Path != module {
			return nil, fmt.Errorf("apilist: packages of two modules, %s and %s, under %s", module, p.Module.Path, dir)
		}
	}

	var out []Listing
	files := make(map[string]string) // file name -> import path
	for _, p := range pkgs {
		if !public(module, p) {
			continue
		}
		for _, f := range p.IgnoredFiles {
			if !strings.HasSuffix(f, ".go") || strings.HasSuffix(f, "_test.go") {
				continue
			}
			if ignored, err := ignoredEverywhere(f); err != nil {
				return nil, err
			} else if !ignored {
				return nil, fmt.Errorf("apilist: package %s has %s, which build constraints exclude on this machine: its listing would differ between machines", p.PkgPath, filepath.Base(f))
			}
		}
		file, err := FileName(module, p.PkgPath)
		if err != nil {
			return nil, err
		}
		if other, dup := files[file]; dup {
			return nil, fmt.Errorf("apilist: packages %s and %s both map to api/%s", other, p.PkgPath, file)
		}
		files[file] = p.PkgPath
		name, _ := below(module, p.PkgPath)
		if name == "" {
			name = rootName(module)
		}
		out = append(out, Listing{
			Path:  p.PkgPath,
			Name:  name,
			File:  file,
			Lines: features(module, name, p.Types),
		})
	}
	slices.SortFunc(out, func(a, b Listing) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

// ignoredEverywhere reports whether the Go file f is kept out of every
// build by the line //go:build ignore (a generator run with go run, say).
func ignoredEverywhere(f string) (bool, error) {
	src, err := os.ReadFile(f)
	if err != nil {
		return false, fmt.Errorf("apilist: %w", err)
	}
	for line := range strings.Lines(string(src)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "package ") {
			break
		}
		if !constraint.IsGoBuild(line) {
			continue
		}
		expr, err := constraint.Parse(line)
		if err != nil {
			return false, fmt.Errorf("apilist: %s: %w", f, err)
		}
		tag, ok := expr.(*constraint.TagExpr)
		return ok && tag.Tag == "ignore", nil
	}
	return false, nil
}

// public reports whether p is one of the module's public packages.
func public(module string, p *packages.Package) bool {
	if len(p.GoFiles) == 0 || p.Name == "main" {
		return false
	}
	rel, ok := below(module, p.PkgPath)
	if !ok {
		return false
	}
	elems := strings.Split(rel, "/")
	if elems[0] == "cmd" || elems[0] == "examples" {
		return false
	}
	return !slices.Contains(elems, "internal")
}

// below returns the path of pkg below module: "" for the module's root
// package, "sink/natssink" for module+"/sink/natssink".
func below(module, pkg string) (string, bool) {
	if pkg == module {
		return "", true
	}
	rel, ok := strings.CutPrefix(pkg, module+"/")
	return rel, ok
}

// rootName returns the name of the module's root package in the listing:
// the last element of the module path, or the one before a major version
// suffix ("outbox" for github.com/outboxkit/outbox/v2).
func rootName(module string) string {
	base := path.Base(module)
	if v, ok := strings.CutPrefix(base, "v"); ok && v != "" && strings.Trim(v, "0123456789") == "" && path.Dir(module) != "." {
		return path.Base(path.Dir(module))
	}
	return base
}

// FileName returns the name of the listing file of the package pkg of the
// module: its path below the module with each "/" replaced by "_", and
// ".txt" added ("sink/natssink" is "sink_natssink.txt"); the root package
// takes the last element of the module path, before any major version
// suffix ("outbox.txt"). So that a file
// name maps back to one import path, a path below the module may not hold
// "_"; Generate also refuses two packages with one file name (a root
// package and a top-level directory of the same name).
func FileName(module, pkg string) (string, error) {
	rel, ok := below(module, pkg)
	if !ok {
		return "", fmt.Errorf("apilist: package %s is not in module %s", pkg, module)
	}
	if rel == "" {
		return rootName(module) + ".txt", nil
	}
	if strings.Contains(rel, "_") {
		return "", fmt.Errorf("apilist: package path %s holds %q, which the api/ file names use for %q: rename the directory", pkg, "_", "/")
	}
	return strings.ReplaceAll(rel, "/", "_") + ".txt", nil
}

// features returns the sorted lines of the exported API of pkg.
func features(module, name string, pkg *types.Package) []string {
	w := &walker{module: module, pkg: pkg, prefix: "pkg " + name + ", ", seen: make(map[string]bool)}
	scope := pkg.Scope()
	for _, n := range scope.Names() {
		if obj := scope.Lookup(n); obj.Exported() {
			w.object(obj)
		}
	}
	lines := make([]string, 0, len(w.seen))
	for l := range w.seen {
		lines = append(lines, l)
	}
	slices.Sort(lines)
	return lines
}

// walker writes the lines of one package.
type walker struct {
	module string
	pkg    *types.Package
	prefix string   // "pkg relay, "
	scope  []string // enclosing declarations: "type Config struct"
	seen   map[string]bool
}

func (w *walker) emit(format string, args ...any) {
	l := w.prefix
	for _, s := range w.scope {
		l += s + ", "
	}
	l += fmt.Sprintf(format, args...)
	if strings.Contains(l, "\n") {
		panic("apilist: a line with a newline: " + l)
	}
	if w.seen[l] {
		panic("apilist: a line twice: " + l)
	}
	w.seen[l] = true
}

// in runs f with s added to the scope of each line it emits.
func (w *walker) in(s string, f func()) {
	w.scope = append(w.scope, s)
	f()
	w.scope = w.scope[:len(w.scope)-1]
}

func (w *walker) object(obj types.Object) {
	switch obj := obj.(type) {
	case *types.Const:
		w.emit("const %s %s", obj.Name(), w.typ(obj.Type()))
		short, exact := obj.Val().String(), obj.Val().ExactString()
		if short == exact {
			w.emit("const %s = %s", obj.Name(), short)
		} else {
			w.emit("const %s = %s  // %s", obj.Name(), short, exact)
		}
	case *types.Var:
		w.emit("var %s %s", obj.Name(), w.typ(obj.Type()))
	case *types.Func:
		w.emit("func %s%s", obj.Name(), w.signature(obj.Signature()))
	case *types.TypeName:
		w.typeName(obj)
	default:
		panic(fmt.Sprintf("apilist: an object of kind %T: %s", obj, obj))
	}
}

func (w *walker) typeName(obj *types.TypeName) {
	name := obj.Name()
	if alias, ok := obj.Type().(*types.Alias); ok {
		if tps := alias.TypeParams(); tps.Len() > 0 {
			name += w.typeParams(tps, true)
		}
		head := fmt.Sprintf("type %s = %s", name, w.typ(alias.Rhs()))
		w.emit("%s", head)
		// A type of another package of this module re-exported here: its
		// fields and methods are this package's API too.
		if n, ok := types.Unalias(alias).(*types.Named); ok && n.Obj().Pkg() != nil && n.Obj().Pkg() != w.pkg {
			if _, mine := below(w.module, n.Obj().Pkg().Path()); mine {
				w.in(head, func() {
					w.members(n, true)
					w.methods(n)
				})
			}
		}
		return
	}
	named := obj.Type().(*types.Named)
	if tps := named.TypeParams(); tps.Len() > 0 {
		name += w.typeParams(tps, true)
	}
	switch u := named.Underlying().(type) {
	case *types.Struct:
		head := "type " + name + " struct"
		w.emit("%s", head)
		w.in(head, func() { w.members(named, false) })
	case *types.Interface:
		head := "type " + name + " interface"
		w.in(head, func() { w.members(named, false) })
		// The whole method set on one line too, as long as it is closed
		// (no unexported method): a method added to an interface breaks
		// its implementations outside the package.
		if parts, closed := w.interfaceParts(u); closed {
			w.emit("type %s interface %s", name, braced(parts))
		}
	default:
		w.emit("type %s %s", name, w.typ(u))
	}
	w.methods(named)
}

// members emits the fields of a struct or the methods of an interface.
// alias says n is the target of an alias, where a type that is neither
// struct nor interface shows its underlying type (the alias line shows only
// the target's name).
func (w *walker) members(n *types.Named, alias bool) {
	switch u := n.Underlying().(type) {
	case *types.Struct:
		for f := range u.Fields() {
			if !f.Exported() {
				continue
			}
			if f.Anonymous() {
				w.emit("embedded %s", w.typ(f.Type()))
			} else {
				w.emit("%s %s", f.Name(), w.typ(f.Type()))
			}
		}
	case *types.Interface:
		unexported := false
		mset := types.NewMethodSet(u)
		for sel := range mset.Methods() {
			m := sel.Obj().(*types.Func)
			if !m.Exported() {
				unexported = true
				continue
			}
			w.emit("%s%s", m.Name(), w.signature(m.Signature()))
		}
		if unexported {
			// Only this package can implement the interface: it may
			// gain methods, and a lost one shows above.
			w.emit("unexported methods")
		}
	default:
		if alias {
			w.emit("underlying %s", w.typ(u))
		}
	}
}

// methods emits the exported methods of the named type n, with those
// promoted from embedded fields: those of n, then those of *n that n lacks.
// An interface's methods are its members instead.
func (w *walker) methods(n *types.Named) {
	if types.IsInterface(n) {
		return
	}
	done := make(map[string]bool)
	for _, t := range []types.Type{n, types.NewPointer(n)} {
		mset := types.NewMethodSet(t)
		for sel := range mset.Methods() {
			m := sel.Obj()
			if !m.Exported() || done[m.Name()] {
				continue
			}
			done[m.Name()] = true
			w.method(sel)
		}
	}
}

func (w *walker) method(sel *types.Selection) {
	sig := sel.Type().(*types.Signature)
	recv := w.typ(sig.Recv().Type())
	if tps := sig.RecvTypeParams(); tps.Len() > 0 {
		recv += w.typeParams(tps, false)
	}
	w.emit("method (%s) %s%s", recv, sel.Obj().Name(), w.signature(sig))
}

// interfaceParts returns the sorted names of the methods of an interface
// followed by its type terms, and whether all its methods are exported.
func (w *walker) interfaceParts(u *types.Interface) ([]string, bool) {
	var parts []string
	closed := true
	for m := range u.Methods() {
		closed = closed && m.Exported()
		parts = append(parts, m.Name())
	}
	slices.Sort(parts)
	return append(parts, w.terms(u)...), closed
}

func (w *walker) typ(t types.Type) string {
	var b bytes.Buffer
	w.writeType(&b, t)
	return b.String()
}

func (w *walker) signature(sig *types.Signature) string {
	var b bytes.Buffer
	w.writeSignature(&b, sig)
	return b.String()
}

func (w *walker) typeParams(tps *types.TypeParamList, constraints bool) string {
	var b bytes.Buffer
	b.WriteByte('[')
	for i := range tps.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		tp := tps.At(i)
		w.writeType(&b, tp)
		if constraints {
			b.WriteByte(' ')
			w.writeType(&b, tp.Constraint())
		}
	}
	b.WriteByte(']')
	return b.String()
}

// writeType writes t as the Go distribution's api files do: types of other
// packages qualified by package name, aliases by their target, byte and
// rune as uint8 and int32, untyped constants' types as ideal-int and the
// like, and type parameters by their index ($0), since renaming one
// changes nothing for a caller.
func (w *walker) writeType(b *bytes.Buffer, t types.Type) {
	switch t := t.(type) {
	case *types.Basic:
		b.WriteString(basicName(t))
	case *types.Array:
		fmt.Fprintf(b, "[%d]", t.Len())
		w.writeType(b, t.Elem())
	case *types.Slice:
		b.WriteString("[]")
		w.writeType(b, t.Elem())
	case *types.Struct:
		// An unnamed struct type: its fields are not listed, as in the
		// Go distribution's api files.
		b.WriteString("struct")
	case *types.Pointer:
		b.WriteByte('*')
		w.writeType(b, t.Elem())
	case *types.Signature:
		b.WriteString("func")
		w.writeSignature(b, t)
	case *types.Interface:
		w.writeInterface(b, t)
	case *types.Map:
		b.WriteString("map[")
		w.writeType(b, t.Key())
		b.WriteByte(']')
		w.writeType(b, t.Elem())
	case *types.Chan:
		switch t.Dir() {
		case types.SendOnly:
			b.WriteString("chan<- ")
		case types.RecvOnly:
			b.WriteString("<-chan ")
		default:
			b.WriteString("chan ")
		}
		w.writeType(b, t.Elem())
	case *types.Alias:
		w.writeType(b, types.Unalias(t))
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() != nil && obj.Pkg() != w.pkg {
			b.WriteString(obj.Pkg().Name())
			b.WriteByte('.')
		}
		b.WriteString(obj.Name())
		if args := t.TypeArgs(); args.Len() > 0 {
			b.WriteByte('[')
			for i := range args.Len() {
				if i > 0 {
					b.WriteString(", ")
				}
				w.writeType(b, args.At(i))
			}
			b.WriteByte(']')
		}
	case *types.TypeParam:
		fmt.Fprintf(b, "$%d", t.Index())
	default:
		panic(fmt.Sprintf("apilist: a type of kind %T: %s", t, t))
	}
}

func basicName(t *types.Basic) string {
	switch t.Kind() {
	case types.UnsafePointer:
		return "unsafe.Pointer"
	case types.UntypedBool:
		return "ideal-bool"
	case types.UntypedInt:
		return "ideal-int"
	case types.UntypedRune:
		return "ideal-char"
	case types.UntypedFloat:
		return "ideal-float"
	case types.UntypedComplex:
		return "ideal-complex"
	case types.UntypedString:
		return "ideal-string"
	case types.Byte:
		return "uint8"
	case types.Rune:
		return "int32"
	}
	return t.Name()
}

// writeInterface writes an interface type literal: its sorted method names,
// then its type terms ("~int | ~int64"), sorted.
func (w *walker) writeInterface(b *bytes.Buffer, t *types.Interface) {
	parts, _ := w.interfaceParts(t)
	b.WriteString("interface" + braced(parts))
}

// braced returns "{}", or "{ a, b }".
func braced(parts []string) string {
	if len(parts) == 0 {
		return "{}"
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

// terms returns the type-set unions an interface embeds, through the
// interfaces it embeds, each with its terms sorted, and sorted: the order
// they are written in changes nothing.
func (w *walker) terms(t *types.Interface) []string {
	var out []string
	for e := range t.EmbeddedTypes() {
		switch e := types.Unalias(e).(type) {
		case *types.Interface:
			out = append(out, w.terms(e)...)
		case *types.Union:
			var terms []string
			for i := range e.Len() {
				term := e.Term(i)
				s := w.typ(term.Type())
				if term.Tilde() {
					s = "~" + s
				}
				terms = append(terms, s)
			}
			slices.Sort(terms)
			out = append(out, strings.Join(terms, " | "))
		case *types.Named:
			if i, ok := e.Underlying().(*types.Interface); ok {
				out = append(out, w.terms(i)...)
			} else {
				// A single type term: interface{ int }.
				out = append(out, w.typ(e))
			}
		default:
			out = append(out, w.typ(e))
		}
	}
	slices.Sort(out)
	return out
}

func (w *walker) writeSignature(b *bytes.Buffer, sig *types.Signature) {
	if tps := sig.TypeParams(); tps.Len() > 0 {
		b.WriteString(w.typeParams(tps, true))
	}
	w.writeParams(b, sig.Params(), sig.Variadic())
	switch res := sig.Results(); res.Len() {
	case 0:
	case 1:
		b.WriteByte(' ')
		w.writeType(b, res.At(0).Type())
	default:
		b.WriteByte(' ')
		w.writeParams(b, res, false)
	}
}

func (w *walker) writeParams(b *bytes.Buffer, t *types.Tuple, variadic bool) {
	b.WriteByte('(')
	for i := range t.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		typ := t.At(i).Type()
		if variadic && i == t.Len()-1 {
			b.WriteString("...")
			typ = typ.(*types.Slice).Elem()
		}
		w.writeType(b, typ)
	}
	b.WriteByte(')')
}

// Write makes the directory dir hold exactly the listings: one file each,
// a line per item, and no other .txt file.
func Write(dir string, listings []Listing) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	keep := make(map[string]bool)
	for _, l := range listings {
		keep[l.File] = true
		if err := os.WriteFile(filepath.Join(dir, l.File), content(l), 0o644); err != nil {
			return err
		}
	}
	old, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return err
	}
	for _, f := range old {
		if !keep[filepath.Base(f)] {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	return nil
}

func content(l Listing) []byte {
	var b bytes.Buffer
	for _, line := range l.Lines {
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// Compare compares the listings with the files of the directory dir, and
// returns what differs, one problem a string: no directory dir, a listing
// with no file, a
// .txt file that lists no public package, and a file whose lines differ,
// with the lines the code has (+) and the file lacks, and the lines the
// file has (-) and the code lacks.
func Compare(dir string, listings []Listing) ([]string, error) {
	base := filepath.Base(dir)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return []string{fmt.Sprintf("%s/ is missing: no package of the module has a listing", base)}, nil
	}
	var problems []string
	want := make(map[string]bool)
	for _, l := range listings {
		want[l.File] = true
		got, err := os.ReadFile(filepath.Join(dir, l.File))
		if errors.Is(err, os.ErrNotExist) {
			problems = append(problems, fmt.Sprintf("%s/%s is missing: package %s is public and has no listing", base, l.File, l.Path))
			continue
		}
		if err != nil {
			return nil, err
		}
		if bytes.Equal(got, content(l)) {
			continue
		}
		problems = append(problems, fmt.Sprintf("%s/%s differs from the exported API of package %s:\n%s", base, l.File, l.Path, diff(l.Lines, got)))
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if !want[filepath.Base(f)] {
			problems = append(problems, fmt.Sprintf("%s/%s lists no public package: its package is gone, moved, internal or a command now", base, filepath.Base(f)))
		}
	}
	return problems, nil
}

// diff returns the lines only the code has, marked +, and those only the
// file has, marked -, in sorted order.
func diff(code []string, file []byte) string {
	fileLines := strings.Split(strings.TrimSuffix(string(file), "\n"), "\n")
	if len(file) == 0 {
		fileLines = nil
	}
	inFile := make(map[string]bool, len(fileLines))
	for _, l := range fileLines {
		inFile[l] = true
	}
	inCode := make(map[string]bool, len(code))
	for _, l := range code {
		inCode[l] = true
	}
	type change struct {
		line string
		mark byte
	}
	var changes []change
	for _, l := range code {
		if !inFile[l] {
			changes = append(changes, change{l, '+'})
		}
	}
	for _, l := range fileLines {
		if !inCode[l] {
			changes = append(changes, change{l, '-'})
		}
	}
	if len(changes) == 0 {
		// The same lines in another order or twice: the file was edited
		// by hand.
		return "\t(the same lines, in another order or repeated)"
	}
	slices.SortStableFunc(changes, func(a, b change) int { return strings.Compare(a.line, b.line) })
	var b strings.Builder
	for i, c := range changes {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "\t%c %s", c.mark, c.line)
	}
	return b.String()
}
