package docsnippets

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// ref is one relative link to check: where it is written and its target
// as written (a path, a #anchor, or both).
type ref struct {
	where  string // file:line, the file relative to the module root with slashes
	file   string // the file the link is in, relative to the module root with slashes
	target string
	root   bool // target is relative to the module root (a Go file's docs/<file>.md#<anchor>), not to file's folder
}

var (
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	setextLine = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	htmlAnchor = regexp.MustCompile(`(?i)<a\s[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']`)
	inlineLink = regexp.MustCompile(`\]\(\s*(<[^>\n]*>|[^\s()]+)(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)`)
	refDef     = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
	imageMD    = regexp.MustCompile(`!\[([^\]]*)\]\([^)]*\)`)
	linkMD     = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
	scheme     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	lineAnchor = regexp.MustCompile(`^L[0-9]+(-L[0-9]+)?$`)
	// goDocRef is a reference to a Markdown anchor in Go source, written
	// relative to the module root, such as docs/benchmarks.md#summary.
	goDocRef = regexp.MustCompile(`(?:^|[^\w./-])((?:docs/[\w.-]+|README)\.md#[\p{L}\p{N}_-]+)`)
)

// markdown is what the link check needs of one Markdown file: the anchors
// it defines and the links it holds.
type markdown struct {
	anchors map[string]bool
	links   []ref
}

// parseMarkdown reads a Markdown file's headings, explicit <a id>/<a name>
// anchors and relative links, outside fenced code blocks and code spans.
func parseMarkdown(file, content string) (markdown, error) {
	md := markdown{anchors: map[string]bool{}}
	slugs := slugger{}
	lines := strings.Split(strings.ReplaceAll(content, "\r\n", "\n"), "\n")
	var para []string // the lines of the paragraph above, for a setext heading
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := fence.FindStringSubmatch(l); m != nil {
			marker, start := m[2], i
			closed := false
			for i++; i < len(lines); i++ {
				if c := fence.FindStringSubmatch(lines[i]); c != nil && c[3] == "" &&
					c[2][0] == marker[0] && len(c[2]) >= len(marker) &&
					strings.TrimSpace(lines[i][len(c[0]):]) == "" {
					closed = true
					break
				}
			}
			if !closed {
				return md, fmt.Errorf("%s:%d: code block is never closed", file, start+1)
			}
			para = nil
			continue
		}
		prose := stripCodeSpans(l)
		for _, m := range htmlAnchor.FindAllStringSubmatch(prose, -1) {
			md.anchors[m[1]] = true
		}
		for _, m := range inlineLink.FindAllStringSubmatch(prose, -1) {
			md.links = append(md.links, ref{where: fmt.Sprintf("%s:%d", file, i+1), file: file, target: strings.Trim(m[1], "<>")})
		}
		if m := refDef.FindStringSubmatch(prose); m != nil {
			md.links = append(md.links, ref{where: fmt.Sprintf("%s:%d", file, i+1), file: file, target: strings.Trim(m[1], "<>")})
		}
		switch {
		case strings.TrimSpace(l) == "":
			para = nil
		case atxHeading.MatchString(l):
			md.anchors[slugs.slug(headingText(atxHeading.FindStringSubmatch(l)[2]))] = true
			para = nil
		case setextLine.MatchString(l) && len(para) > 0:
			md.anchors[slugs.slug(headingText(strings.Join(para, " ")))] = true
			para = nil
		case paragraphLine(l):
			para = append(para, strings.TrimSpace(l))
		default:
			para = nil
		}
	}
	return md, nil
}

// paragraphLine reports whether a line can be part of a paragraph that a
// setext underline makes a heading: not a list item, quote, table row or
// HTML block.
func paragraphLine(l string) bool {
	t := strings.TrimLeft(l, " ")
	if len(l)-len(t) > 3 {
		return false
	}
	for _, p := range []string{"- ", "* ", "+ ", ">", "|", "<"} {
		if strings.HasPrefix(t, p) {
			return false
		}
	}
	if i := strings.IndexFunc(t, func(r rune) bool { return r < '0' || r > '9' }); i > 0 && i < len(t) && (t[i] == '.' || t[i] == ')') {
		return false
	}
	return true
}

// stripCodeSpans blanks out the code spans of a line (backticks and
// content), so that what they show is not taken for links.
func stripCodeSpans(l string) string {
	var b strings.Builder
	for {
		open := strings.IndexByte(l, '`')
		if open < 0 {
			b.WriteString(l)
			return b.String()
		}
		n := open
		for n < len(l) && l[n] == '`' {
			n++
		}
		run := l[open:n]
		end := closingRun(l[n:], len(run))
		if end < 0 {
			b.WriteString(l)
			return b.String()
		}
		b.WriteString(l[:open])
		b.WriteString(strings.Repeat(" ", n-open+end+len(run)))
		l = l[n+end+len(run):]
	}
}

// closingRun returns the index in s of a run of exactly n backticks, or -1.
func closingRun(s string, n int) int {
	for i := 0; i < len(s); {
		if s[i] != '`' {
			i++
			continue
		}
		j := i
		for j < len(s) && s[j] == '`' {
			j++
		}
		if j-i == n {
			return i
		}
		i = j
	}
	return -1
}

// headingText is the text GitHub renders for a heading's Markdown: code
// spans' content as written, links and images by their text, no HTML
// tags, no emphasis markers, backslash escapes resolved.
func headingText(md string) string {
	var b strings.Builder
	for md != "" {
		open := strings.IndexByte(md, '`')
		if open < 0 {
			b.WriteString(inlineText(md))
			break
		}
		n := open
		for n < len(md) && md[n] == '`' {
			n++
		}
		end := closingRun(md[n:], n-open)
		if end < 0 {
			b.WriteString(inlineText(md))
			break
		}
		b.WriteString(inlineText(md[:open]))
		code := md[n : n+end]
		if len(code) > 1 && code[0] == ' ' && code[len(code)-1] == ' ' && strings.Trim(code, " ") != "" {
			code = code[1 : len(code)-1]
		}
		b.WriteString(code)
		md = md[n+end+(n-open):]
	}
	return b.String()
}

// inlineText renders Markdown outside code spans as text: links and
// images by their text, HTML tags dropped, backslash escapes resolved, and
// the * and _ runs that pair up as emphasis (CommonMark's flanking rules)
// dropped; a run that pairs with nothing, such as the _ of snake_case, is
// text.
func inlineText(s string) string {
	s = imageMD.ReplaceAllString(s, "$1")
	s = linkMD.ReplaceAllString(s, "$1")
	s = htmlTag.ReplaceAllString(s, "")

	type run struct {
		start, end        int // rune offsets in rs
		char              rune
		canOpen, canClose bool
		drop              bool
	}
	var (
		rs      []rune
		literal []bool // rs[i] came from a backslash escape
		runs    []run
	)
	in := []rune(s)
	for i := 0; i < len(in); i++ {
		if in[i] == '\\' && i+1 < len(in) && in[i+1] < unicode.MaxASCII && (unicode.IsPunct(in[i+1]) || unicode.IsSymbol(in[i+1])) {
			i++
			rs, literal = append(rs, in[i]), append(literal, true)
			continue
		}
		rs, literal = append(rs, in[i]), append(literal, false)
	}
	space := func(i int) bool { return i < 0 || i >= len(rs) || unicode.IsSpace(rs[i]) }
	punct := func(i int) bool {
		return i >= 0 && i < len(rs) && (unicode.IsPunct(rs[i]) || unicode.IsSymbol(rs[i]))
	}
	for i := 0; i < len(rs); {
		c := rs[i]
		if (c != '*' && c != '_') || literal[i] {
			i++
			continue
		}
		j := i
		for j < len(rs) && rs[j] == c && !literal[j] {
			j++
		}
		left := !space(j) && (!punct(j) || space(i-1) || punct(i-1))
		right := !space(i-1) && (!punct(i-1) || space(j) || punct(j))
		r := run{start: i, end: j, char: c, canOpen: left, canClose: right}
		if c == '_' {
			r.canOpen = left && (!right || punct(i-1))
			r.canClose = right && (!left || punct(j))
		}
		runs = append(runs, r)
		i = j
	}
	for k := range runs {
		if !runs[k].canClose {
			continue
		}
		for o := k - 1; o >= 0; o-- {
			if runs[o].char == runs[k].char && runs[o].canOpen && !runs[o].drop {
				runs[o].drop, runs[k].drop = true, true
				runs[o].canOpen, runs[k].canOpen = false, false
				break
			}
		}
	}
	drop := make([]bool, len(rs))
	for _, r := range runs {
		for i := r.start; r.drop && i < r.end; i++ {
			drop[i] = true
		}
	}
	var b strings.Builder
	for i, r := range rs {
		if !drop[i] {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// slugger gives headings GitHub's anchors: the text lowercased, every
// character that is not a letter, a mark, a number, a connector (_), a
// hyphen or a space removed, each space turned into a hyphen; a slug
// already given gets -1, -2, … appended.
type slugger map[string]bool

func (s slugger) slug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsNumber(r) || unicode.Is(unicode.Pc, r):
			b.WriteRune(r)
		}
	}
	base := b.String()
	slug := base
	for n := 1; s[slug]; n++ {
		slug = base + "-" + strconv.Itoa(n)
	}
	s[slug] = true
	return slug
}

// goRefs returns the references to Markdown anchors written in the Go
// files under root (comments and strings alike), skipping folders whose
// name starts with . or _, testdata, and the folders in skip (relative to
// root, with slashes).
func goRefs(root string, skip ...string) ([]ref, error) {
	var refs []ref
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" ||
				name == "node_modules" || slices.Contains(skip, filepath.ToSlash(rel))) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		content, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		for i, l := range strings.Split(string(content), "\n") {
			for _, m := range goDocRef.FindAllStringSubmatch(l, -1) {
				refs = append(refs, ref{where: fmt.Sprintf("%s:%d", rel, i+1), file: rel, target: m[1], root: true})
			}
		}
		return nil
	})
	return refs, err
}

// checkLinks checks every relative link of the Markdown files mdFiles
// (relative to root, with slashes) and every reference in extra: the
// target file or folder exists inside root, and an #anchor exists in the
// target Markdown file (a #L12 line anchor in any other file). It returns
// one message per dead link.
func checkLinks(root string, mdFiles []string, extra []ref) ([]string, error) {
	parsed := map[string]markdown{}
	load := func(file string) (markdown, error) {
		if md, ok := parsed[file]; ok {
			return md, nil
		}
		content, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			return markdown{}, err
		}
		md, err := parseMarkdown(file, string(content))
		if err != nil {
			return markdown{}, err
		}
		parsed[file] = md
		return md, nil
	}
	refs := slices.Clone(extra)
	for _, f := range mdFiles {
		md, err := load(f)
		if err != nil {
			return nil, err
		}
		refs = append(refs, md.links...)
	}

	var msgs []string
	for _, r := range refs {
		if scheme.MatchString(r.target) || strings.HasPrefix(r.target, "//") {
			continue // a URL: not checked here
		}
		p, anchor, _ := strings.Cut(r.target, "#")
		if q := strings.IndexByte(p, '?'); q >= 0 {
			p = p[:q]
		}
		p, err := url.PathUnescape(p)
		if err != nil {
			msgs = append(msgs, fmt.Sprintf("%s: link %q: bad escape in the path: %v", r.where, r.target, err))
			continue
		}
		if a, err := url.PathUnescape(anchor); err == nil {
			anchor = a
		}
		target := r.file
		switch {
		case p != "" && r.root:
			target = path.Clean(p)
		case strings.HasPrefix(p, "/"):
			target = path.Clean(strings.TrimPrefix(p, "/"))
		case p != "":
			target = path.Join(path.Dir(r.file), p)
		}
		if target == ".." || strings.HasPrefix(target, "../") {
			msgs = append(msgs, fmt.Sprintf("%s: link %q: points outside the repository", r.where, r.target))
			continue
		}
		info, err := os.Stat(filepath.Join(root, filepath.FromSlash(target)))
		if err != nil {
			msgs = append(msgs, fmt.Sprintf("%s: link %q: %s does not exist", r.where, r.target, target))
			continue
		}
		if anchor == "" {
			continue
		}
		if info.IsDir() || !strings.HasSuffix(target, ".md") {
			if info.IsDir() || !lineAnchor.MatchString(anchor) {
				msgs = append(msgs, fmt.Sprintf("%s: link %q: anchor #%s in %s, which is not a Markdown file", r.where, r.target, anchor, target))
			}
			continue
		}
		md, err := load(target)
		if err != nil {
			return nil, err
		}
		if !md.anchors[anchor] {
			msgs = append(msgs, fmt.Sprintf("%s: link %q: %s has no heading or anchor #%s", r.where, r.target, target, anchor))
		}
	}
	return msgs, nil
}

// TestLinksResolve checks every relative link and anchor of README.md and
// docs/*.md, and every docs/<file>.md#<anchor> (or README.md#<anchor>)
// written in the module's Go files but this package's, whose tests cite
// dead anchors on purpose.
func TestLinksResolve(t *testing.T) {
	root := moduleRoot(t)
	files := docs(t, root)
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	self, err := filepath.Rel(root, here)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := goRefs(root, filepath.ToSlash(self))
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := checkLinks(root, files, refs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checked the links of %d Markdown files and %d docs anchors cited in Go files", len(files), len(refs))
	for _, m := range msgs {
		t.Error(m)
	}
}

// TestDeadLinksAreReported pins what the check finds in a small
// repository (testdata/links): each kind of dead link once, and nothing
// that resolves.
func TestDeadLinksAreReported(t *testing.T) {
	root := filepath.Join("testdata", "links")
	refs, err := goRefs(root)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := checkLinks(root, []string{"README.md", "docs/a.md"}, refs)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(msgs, "\n")
	t.Logf("the report:\n%s", all)
	want := []string{
		`pkg/x.go:3: link "docs/a.md#gone": docs/a.md has no heading or anchor #gone`,
		`README.md:3: link "docs/missing.md": docs/missing.md does not exist`,
		`README.md:3: link "docs/a.md#nowhere": docs/a.md has no heading or anchor #nowhere`,
		`README.md:4: link "../outside.md": points outside the repository`,
		`README.md:4: link "pkg/x.go#main": anchor #main in pkg/x.go, which is not a Markdown file`,
		`docs/a.md:5: link "#notes-2": docs/a.md has no heading or anchor #notes-2`,
		`docs/a.md:8: link "b.md": docs/b.md does not exist`,
	}
	if !slices.Equal(msgs, want) {
		t.Errorf("report:\n%s\nwant:\n%s", all, strings.Join(want, "\n"))
	}
}

// TestSlugs pins GitHub's heading anchors for the shapes the docs use.
func TestSlugs(t *testing.T) {
	s := slugger{}
	for _, c := range []struct{ heading, want string }{
		{"Summary", "summary"},
		{"Writers that wake the relay (`--wakeups writers`)", "writers-that-wake-the-relay---wakeups-writers"},
		{"Events sent with the COMMIT (`outboxpgx.Driver.Begin`)", "events-sent-with-the-commit-outboxpgxdriverbegin"},
		{"Cloud brokers (Pub/Sub, Kinesis)", "cloud-brokers-pubsub-kinesis"},
		{"The row against Watermill's on a CPU-bound day", "the-row-against-watermills-on-a-cpu-bound-day"},
		{"`WriteTx` as users write it", "writetx-as-users-write-it"},
		{"Checking a change: `outbox contract check OLD NEW`", "checking-a-change-outbox-contract-check-old-new"},
		{"The `outbox_wakeup` table and **bold** _emphasis_", "the-outbox_wakeup-table-and-bold-emphasis"},
		{"A [link](x.md) and 2× – faster", "a-link-and-2--faster"},
		{"`outbox relay`: the OTEL_* variables", "outbox-relay-the-otel_-variables"},
		{"snake_case and __init__ and \\_escaped\\_", "snake_case-and-init-and-_escaped_"},
		{"Summary", "summary-1"},
		{"Summary", "summary-2"},
		{"Grüße", "grüße"},
	} {
		if got := s.slug(headingText(c.heading)); got != c.want {
			t.Errorf("slug(%q) = %q, want %q", c.heading, got, c.want)
		}
	}
}
