package docsnippets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/gobuild"
)

// block is one ```go fenced block of a Markdown file.
type block struct {
	file      string // the Markdown file, relative to the module root, with slashes
	line      int    // line of the opening fence, from 1
	code      string // the block's lines, fence excluded
	setup     string // the fragment-setup comment's Go source, if any
	setupLine int    // line of the setup's first line of source
	complete  bool   // the block is a whole file (it starts with a package clause)
}

// where names the block for humans: README.md:57.
func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

const setupOpen = "<!-- fragment-setup"

var fence = regexp.MustCompile("^( {0,3})(```+|~~~+)[ \t]*([^ \t`]*)")

// extract returns the ```go blocks of a Markdown file's content. A block
// that is not a complete file takes the fragment-setup comment right above
// it, if any.
func extract(file, content string) ([]block, error) {
	lines := strings.Split(strings.ReplaceAll(content, "\r\n", "\n"), "\n")
	var (
		blocks    []block
		setup     string
		setupLine int
		hasSetup  bool // a setup comment ended, with only blank lines since
	)
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(strings.TrimSpace(l), setupOpen) {
			start := i
			var src []string
			rest := strings.TrimPrefix(strings.TrimSpace(l), setupOpen)
			for {
				if j := strings.Index(rest, "-->"); j >= 0 {
					src = append(src, rest[:j])
					break
				}
				src = append(src, rest)
				i++
				if i == len(lines) {
					return nil, fmt.Errorf("%s:%d: fragment-setup comment is never closed with -->", file, start+1)
				}
				rest = lines[i]
			}
			setup, setupLine, hasSetup = strings.Join(src, "\n"), start+1, true
			continue
		}
		m := fence.FindStringSubmatch(l)
		if m == nil {
			if strings.TrimSpace(l) != "" {
				hasSetup = false
			}
			continue
		}
		indent, marker, info := len(m[1]), m[2], m[3]
		start := i
		var code []string
		closed := false
		for i++; i < len(lines); i++ {
			if c := fence.FindStringSubmatch(lines[i]); c != nil && c[3] == "" &&
				c[2][0] == marker[0] && len(c[2]) >= len(marker) &&
				strings.TrimSpace(lines[i][len(c[0]):]) == "" {
				closed = true
				break
			}
			ln := lines[i]
			for k := 0; k < indent && strings.HasPrefix(ln, " "); k++ {
				ln = ln[1:]
			}
			code = append(code, ln)
		}
		if !closed {
			return nil, fmt.Errorf("%s:%d: code block is never closed", file, start+1)
		}
		if info == "go" {
			b := block{file: file, line: start + 1, code: strings.Join(code, "\n") + "\n", complete: isFile(code)}
			if hasSetup && !b.complete {
				b.setup, b.setupLine = setup, setupLine
			}
			blocks = append(blocks, b)
		}
		hasSetup = false
	}
	return blocks, nil
}

// isFile reports whether the first line that is neither blank nor a line
// comment is a package clause.
func isFile(code []string) bool {
	for _, l := range code {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "//") {
			continue
		}
		return strings.HasPrefix(t, "package ")
	}
	return false
}

// source returns the Go file a block is built as. Line directives point
// every line of the block (and of its setup) back to the Markdown file.
func (b block) source() ([]byte, error) {
	if b.complete {
		return []byte(fmt.Sprintf("//line %s:%d:1\n%s", b.file, b.line+1, b.code)), nil
	}
	src := b.fragment(nil)
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, b.file, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	return b.fragment(declared(f)), nil
}

// fragment wraps a fragment into a file, using the names in used.
func (b block) fragment(used []string) []byte {
	var w bytes.Buffer
	w.WriteString("package snippet\n\n")
	if b.setup != "" {
		fmt.Fprintf(&w, "//line %s:%d:1\n%s\n", b.file, b.setupLine, b.setup)
	}
	fmt.Fprintf(&w, "\nfunc _() {\n//line %s:%d:1\n%s", b.file, b.line+1, b.code)
	for _, n := range used {
		fmt.Fprintf(&w, "_ = %s\n", n)
	}
	w.WriteString("}\n")
	return w.Bytes()
}

// declared returns the variables a fragment declares at the top level of
// its function body, so that they can be marked as used.
func declared(f *ast.File) []string {
	var names []string
	add := func(id *ast.Ident) {
		if id.Name != "_" && !slices.Contains(names, id.Name) {
			names = append(names, id.Name)
		}
	}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "_" || fn.Body == nil {
			continue
		}
		for _, s := range fn.Body.List {
			switch s := s.(type) {
			case *ast.AssignStmt:
				if s.Tok != token.DEFINE {
					continue
				}
				for _, e := range s.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						add(id)
					}
				}
			case *ast.DeclStmt:
				g, ok := s.Decl.(*ast.GenDecl)
				if !ok || g.Tok != token.VAR {
					continue
				}
				for _, sp := range g.Specs {
					for _, id := range sp.(*ast.ValueSpec).Names {
						add(id)
					}
				}
			}
		}
	}
	return names
}

// moduleRoot is the directory holding go.mod, above the working directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = up
	}
}

// docs returns the Markdown files whose snippets are checked, relative to
// root: README.md and docs/*.md.
func docs(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, f := range files {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, filepath.ToSlash(rel))
	}
	return out
}

// dirName is the package directory of a block: docs_relay_md_40.
func (b block) dirName() string {
	s := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, b.file)
	return fmt.Sprintf("%s_%d", strings.ToLower(s), b.line)
}

// TestSnippetsCompile builds every ```go block of README.md and docs/*.md.
func TestSnippetsCompile(t *testing.T) {
	root := moduleRoot(t)
	files := docs(t, root)
	var blocks []block
	for _, f := range files {
		content, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		bs, err := extract(f, string(content))
		if err != nil {
			t.Fatal(err)
		}
		if f == "README.md" && !slices.ContainsFunc(bs, func(b block) bool { return b.complete }) {
			t.Errorf("README.md has no complete ```go program (a block starting with a package clause)")
		}
		blocks = append(blocks, bs...)
	}

	t.Logf("%d ```go blocks in %d files", len(blocks), len(files))
	for _, msg := range build(t, root, blocks) {
		t.Error(msg)
	}
}

// build builds blocks with one go build run from root, in a directory it
// creates beside this file and removes, and returns one message per block
// that does not compile (its file and line first), plus one for failures
// it cannot attribute to a block.
func build(t *testing.T, root string, blocks []block) []string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is needed to build the documentation's snippets: %v", err)
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(here, "_snippets")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	relTmp, err := filepath.Rel(root, tmp)
	if err != nil {
		t.Fatal(err)
	}

	var msgs []string
	byPkg := map[string]block{} // import path suffix -> block
	var pkgs []string
	for _, b := range blocks {
		src, err := b.source()
		if err != nil {
			msgs = append(msgs, fmt.Sprintf("%s: ```go block does not parse: %v", b.where(), err))
			continue
		}
		dir := filepath.Join(tmp, b.dirName())
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "snippet.go"), src, 0o644); err != nil {
			t.Fatal(err)
		}
		rel := filepath.ToSlash(filepath.Join(relTmp, b.dirName()))
		pkgs = append(pkgs, "./"+rel)
		byPkg["/"+rel] = b
	}
	if len(pkgs) == 0 {
		return msgs
	}

	cmd := gobuild.Command(context.Background(), root, pkgs...)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return msgs
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// The output comes in sections headed "# import/path"; attribute each
	// to its block.
	var other strings.Builder
	failed := map[string]*strings.Builder{}
	var order []string
	cur := &other
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if p, ok := strings.CutPrefix(l, "# "); ok {
			cur = &other
			for suffix, b := range byPkg {
				if strings.HasSuffix(p, suffix) {
					if failed[b.where()] == nil {
						failed[b.where()] = &strings.Builder{}
						order = append(order, b.where())
					}
					cur = failed[b.where()]
					break
				}
			}
			if cur == &other {
				other.WriteString(l + "\n")
			}
			continue
		}
		cur.WriteString(l + "\n")
	}
	for _, w := range order {
		msgs = append(msgs, fmt.Sprintf("%s: ```go block does not compile:\n%s", w, failed[w]))
	}
	switch {
	case other.Len() > 0:
		msgs = append(msgs, "go build failed outside the snippets (a package they import does not compile, or a snippet imports what the module lacks):\n"+other.String())
	case len(order) == 0:
		msgs = append(msgs, fmt.Sprintf("go build: %v\n%s", err, out))
	}
	return msgs
}

// TestBrokenSnippetIsReported pins what a failure says: the Markdown file
// and the block's line, then the compiler's errors at Markdown lines.
func TestBrokenSnippetIsReported(t *testing.T) {
	md := strings.Join([]string{
		"# Broken",             // 1
		"```go",                // 2
		"package main",         // 3
		"",                     // 4
		"func main() {",        // 5
		`	var n int = "one"`,   // 6
		"	_ = n",               // 7
		"}",                    // 8
		"```",                  // 9
		"<!-- fragment-setup",  // 10
		`import "fmt"`,         // 11
		"-->",                  // 12
		"```go",                // 13
		"fmt.Println(missing)", // 14
		"```",                  // 15
		"```go",                // 16
		"ok := 1",              // 17
		"```",                  // 18
	}, "\n")
	blocks, err := extract("docs/broken.md", md)
	if err != nil {
		t.Fatal(err)
	}
	msgs := build(t, moduleRoot(t), blocks)
	all := strings.Join(msgs, "\n")
	t.Logf("the report:\n%s", all)
	for _, want := range []string{
		"docs/broken.md:2: ```go block does not compile",
		"docs/broken.md:6:",
		"docs/broken.md:13: ```go block does not compile",
		"docs/broken.md:14:",
		"undefined: missing",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("the report lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "docs/broken.md:16") {
		t.Errorf("a block that compiles is reported:\n%s", all)
	}
	if len(msgs) != 2 {
		t.Errorf("%d messages, want 2:\n%s", len(msgs), all)
	}
}

// TestExtract pins the rule that tells complete files from fragments and
// gives a fragment its setup.
func TestExtract(t *testing.T) {
	md := strings.Join([]string{
		"# Title",                           // 1
		"",                                  // 2
		"```go",                             // 3
		"// Command x.",                     // 4
		"package main",                      // 5
		"```",                               // 6
		"<!-- fragment-setup",               // 7
		`import "fmt"`,                      // 8
		"-->",                               // 9
		"",                                  // 10
		"```go",                             // 11
		`fmt.Println("x")`,                  // 12
		"```",                               // 13
		"<!-- fragment-setup var a int -->", // 14
		"some text between",                 // 15
		"```go",                             // 16
		"b := 1",                            // 17
		"```",                               // 18
		"```sh",                             // 19
		"go test ./...",                     // 20
		"```",                               // 21
		"- a list item:",                    // 22
		"  ```go",                           // 23
		"  c := 2",                          // 24
		"  ```",                             // 25
	}, "\n")
	bs, err := extract("x.md", md)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		line      int
		complete  bool
		setup     string
		setupLine int
		code      string
	}
	var gs []got
	for _, b := range bs {
		gs = append(gs, got{b.line, b.complete, strings.TrimSpace(b.setup), b.setupLine, b.code})
	}
	want := []got{
		{3, true, "", 0, "// Command x.\npackage main\n"},
		{11, false, `import "fmt"`, 7, "fmt.Println(\"x\")\n"},
		{16, false, "", 0, "b := 1\n"},
		{23, false, "", 0, "c := 2\n"},
	}
	if !slices.Equal(gs, want) {
		t.Fatalf("extract:\n got %+v\nwant %+v", gs, want)
	}

	src, err := bs[2].source()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), "_ = b\n") {
		t.Errorf("a fragment's own variables are not marked used:\n%s", src)
	}
	if _, err := extract("y.md", "<!-- fragment-setup\nimport \"fmt\"\n"); err == nil {
		t.Error("an unclosed fragment-setup comment is accepted")
	}
	if _, err := extract("y.md", "```go\nx := 1\n"); err == nil {
		t.Error("an unclosed code block is accepted")
	}
}
