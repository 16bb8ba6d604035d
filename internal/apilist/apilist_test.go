package apilist_test

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/apilist"
)

var update = flag.Bool("update", false, "rewrite the module's api/ listings from its exported API")

// root is the module's root directory, from this package's directory.
const root = "../.."

// regenerate says how to make a deliberate API change; the failures of
// TestAPIListing end with it.
const regenerate = `If the change of the API is deliberate, regenerate the listing with

	go test ./internal/apilist -update

then review the diff of api/ and add a line to docs/changelog.md (docs/api.md).`

// TestAPIListing fails when the exported API of a public package differs
// from its listing under api/, when a public package has no listing, and
// when a listing names no public package.
func TestAPIListing(t *testing.T) {
	listings := generate(t, root)
	if len(listings) == 0 {
		t.Fatal("no public package found under the module root")
	}
	dir := filepath.Join(root, "api")
	if *update {
		if err := apilist.Write(dir, listings); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %d listings to api/", len(listings))
		return
	}
	problems, err := apilist.Compare(dir, listings)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) > 0 {
		t.Fatalf("the exported API differs from its listing under api/:\n\n%s\n\n%s", strings.Join(problems, "\n\n"), regenerate)
	}
}

// generate lists the public packages of the module at dir.
func generate(t *testing.T, dir string) []apilist.Listing {
	t.Helper()
	recordInputs(t, dir)
	listings, err := apilist.Generate(dir)
	if err != nil {
		t.Fatal(err)
	}
	return listings
}

// recordInputs opens each directory and Go file under dir (but those go
// list skips), so that go test's cache, which tracks the files a test
// opens but not those its go list child reads, reruns the test when a
// package changes.
func recordInputs(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != dir && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") || name == "go.mod" || name == "go.sum" {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			return f.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFixture checks the line of each kind of declaration, and which
// packages are public, on the module in testdata/mod.
func TestFixture(t *testing.T) {
	listings := generate(t, "testdata/mod")
	var files []string
	for _, l := range listings {
		files = append(files, l.Path+" "+l.Name+" "+l.File)
	}
	// Not internal/hidden, cmd/tool, tools/gen (main), examples/demo, nor
	// testonly (only a _test.go file).
	wantFiles := []string{
		"example.com/fixture fixture fixture.txt",
		"example.com/fixture/sub sub sub.txt",
	}
	if !slices.Equal(files, wantFiles) {
		t.Fatalf("listings:\n%s\nwant:\n%s", strings.Join(files, "\n"), strings.Join(wantFiles, "\n"))
	}
	check := func(l apilist.Listing, want []string) {
		t.Helper()
		if slices.Equal(l.Lines, want) {
			return
		}
		for _, line := range l.Lines {
			if !slices.Contains(want, line) {
				t.Errorf("%s: unexpected line: %s", l.File, line)
			}
		}
		for _, line := range want {
			if !slices.Contains(l.Lines, line) {
				t.Errorf("%s: missing line: %s", l.File, line)
			}
		}
		if !t.Failed() {
			t.Errorf("%s: lines out of order or repeated:\n%s", l.File, strings.Join(l.Lines, "\n"))
		}
	}
	check(listings[0], []string{
		// Untyped constants: the type ideal-*, then the value; a value
		// that does not print exactly shows its exact form too.
		"pkg fixture, const Answer = 42",
		"pkg fixture, const Answer ideal-int",
		"pkg fixture, const Big = 1267650600228229401496703205376",
		"pkg fixture, const Big ideal-int",
		// Typed constants.
		"pkg fixture, const High = 1",
		"pkg fixture, const High Level",
		"pkg fixture, const Letter = 120",
		"pkg fixture, const Letter ideal-char",
		"pkg fixture, const Low = 0",
		"pkg fixture, const Low Level",
		`pkg fixture, const Name = "fixture"`,
		"pkg fixture, const Name ideal-string",
		"pkg fixture, const On = true",
		"pkg fixture, const On ideal-bool",
		"pkg fixture, const Pi = 3.14159  // 314159265358979323846264338327950288419716939937510582097494459/100000000000000000000000000000000000000000000000000000000000000",
		"pkg fixture, const Pi ideal-float",
		"pkg fixture, const Timeout = 2000000000",
		"pkg fixture, const Timeout time.Duration",
		// Functions: parameter types only, variadic, generic with the
		// type parameters by index and their constraints.
		"pkg fixture, func Group[$0 interface{}, $1 comparable]([]$0, func($0) $1) map[$1][]$0",
		"pkg fixture, func Join(string, ...string) string",
		"pkg fixture, func New(io.Reader, *Config) (*Client, error)",
		"pkg fixture, func Sum[$0 Number](...$0) $0",
		// Methods on the pointer and the value, promoted ones, and a
		// generic type's.
		"pkg fixture, method (*Client) Close() error",
		"pkg fixture, method (*Set[$0, $1]) Add($0, $1)",
		"pkg fixture, method (Client) Ping() error",
		"pkg fixture, method (Client) String() string",
		"pkg fixture, method (Config) Write([]uint8) (int, error)",
		"pkg fixture, method (ID) Valid() bool",
		// Structs: a line for the type, one for each exported field.
		"pkg fixture, type Client struct",
		"pkg fixture, type Client struct, embedded sub.Base",
		"pkg fixture, type Config struct",
		"pkg fixture, type Config struct, Any interface{}",
		"pkg fixture, type Config struct, BatchSize int",
		"pkg fixture, type Config struct, Done <-chan struct",
		"pkg fixture, type Config struct, Events chan<- sub.Event",
		"pkg fixture, type Config struct, Inline struct",
		"pkg fixture, type Config struct, Keys [4]uint8",
		"pkg fixture, type Config struct, Labels map[string][]uint8",
		"pkg fixture, type Config struct, Stringer interface{ String }",
		"pkg fixture, type Config struct, Wait time.Duration",
		"pkg fixture, type Config struct, embedded io.Writer",
		// An alias of a type outside the module: its target only.
		"pkg fixture, type Duration = time.Duration",
		"pkg fixture, type Empty interface {}",
		"pkg fixture, type Handler func(context.Context, []uint8) error",
		"pkg fixture, type ID string",
		"pkg fixture, type Level int",
		// An alias of a type of the same package.
		"pkg fixture, type LocalConfig = Config",
		// Aliases of types in the module's other packages (internal
		// ones too): their fields, methods and underlying type.
		"pkg fixture, type Mode = hidden.Mode",
		"pkg fixture, type Mode = hidden.Mode, method (hidden.Mode) String() string",
		"pkg fixture, type Mode = hidden.Mode, underlying uint8",
		// A type set, its terms sorted.
		"pkg fixture, type Number interface { float64 | ~int | ~int64 }",
		"pkg fixture, type Options = sub.Options",
		"pkg fixture, type Options = sub.Options, Retries int",
		"pkg fixture, type Options = sub.Options, Schema string",
		"pkg fixture, type Options = sub.Options, method (*sub.Options) Validate() error",
		"pkg fixture, type Pair[$0 interface{}] = sub.Pair[$0, $0]",
		"pkg fixture, type Pair[$0 interface{}] = sub.Pair[$0, $0], First $0",
		"pkg fixture, type Pair[$0 interface{}] = sub.Pair[$0, $0], Second $0",
		// An interface with an unexported method: no line of its whole
		// method set, which may grow.
		"pkg fixture, type Sealed interface, Kind() string",
		"pkg fixture, type Sealed interface, unexported methods",
		"pkg fixture, type Set[$0 comparable, $1 interface{}] struct",
		"pkg fixture, type Set[$0 comparable, $1 interface{}] struct, Items map[$0]$1",
		"pkg fixture, type Sink = sub.Sink",
		"pkg fixture, type Sink = sub.Sink, Publish(context.Context, sub.Event) error",
		// An interface: its method set on one line, each method (the
		// embedded interface's too) on its own.
		"pkg fixture, type Source interface { Claim, Close }",
		"pkg fixture, type Source interface, Claim(context.Context, int) ([]string, error)",
		"pkg fixture, type Source interface, Close() error",
		"pkg fixture, var Default *Config",
		"pkg fixture, var ErrClosed error",
		"pkg fixture, var Hook func(context.Context, ...string) (int, error)",
		"pkg fixture, var Raw []uint8",
	})
	check(listings[1], []string{
		"pkg sub, method (*Options) Validate() error",
		"pkg sub, method (Base) Ping() error",
		"pkg sub, type Base struct",
		"pkg sub, type Base struct, Name string",
		"pkg sub, type Event struct",
		"pkg sub, type Event struct, ID string",
		"pkg sub, type Options struct",
		"pkg sub, type Options struct, Retries int",
		"pkg sub, type Options struct, Schema string",
		"pkg sub, type Pair[$0 interface{}, $1 interface{}] struct",
		"pkg sub, type Pair[$0 interface{}, $1 interface{}] struct, First $0",
		"pkg sub, type Pair[$0 interface{}, $1 interface{}] struct, Second $1",
		"pkg sub, type Sink interface { Publish }",
		"pkg sub, type Sink interface, Publish(context.Context, Event) error",
	})
}

// TestCompare checks that Compare finds a listing file missing, one too
// many, and one that differs, and that Write puts all three right.
func TestCompare(t *testing.T) {
	listings := generate(t, "testdata/mod")
	dir := filepath.Join(t.TempDir(), "api")
	if err := apilist.Write(dir, listings); err != nil {
		t.Fatal(err)
	}
	compare := func() []string {
		t.Helper()
		problems, err := apilist.Compare(dir, listings)
		if err != nil {
			t.Fatal(err)
		}
		return problems
	}
	if p := compare(); len(p) > 0 {
		t.Fatalf("Compare after Write: %q", p)
	}

	if err := os.Remove(filepath.Join(dir, "sub.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gone.txt"), []byte("pkg gone, func F()\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "fixture.txt")
	old, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(old), "pkg fixture, func Join(string, ...string) string\n", "pkg fixture, func Join(string, ...string) (string, error)\n", 1)
	if edited == string(old) {
		t.Fatal("fixture.txt has no line of func Join")
	}
	if err := os.WriteFile(file, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"api/fixture.txt differs from the exported API of package example.com/fixture:\n" +
			"\t- pkg fixture, func Join(string, ...string) (string, error)\n" +
			"\t+ pkg fixture, func Join(string, ...string) string",
		"api/sub.txt is missing: package example.com/fixture/sub is public and has no listing",
		"api/gone.txt lists no public package: its package is gone, moved, internal or a command now",
	}
	if got := compare(); !slices.Equal(got, want) {
		t.Fatalf("Compare found:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// The same lines in another order are a difference too: the file is
	// exactly what Write makes.
	lines := strings.SplitAfter(string(old), "\n")
	lines[0], lines[1] = lines[1], lines[0]
	if err := os.WriteFile(file, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := compare(); len(got) == 0 || !strings.Contains(got[0], "the same lines, in another order or repeated") {
		t.Fatalf("Compare of a reordered file found: %q", got)
	}

	if err := apilist.Write(dir, listings); err != nil {
		t.Fatal(err)
	}
	if p := compare(); len(p) > 0 {
		t.Fatalf("Compare after a second Write: %q", p)
	}
}

func TestFileName(t *testing.T) {
	for _, c := range []struct{ pkg, want string }{
		{"github.com/outboxkit/outbox", "outbox.txt"},
		{"github.com/outboxkit/outbox/relay", "relay.txt"},
		{"github.com/outboxkit/outbox/sink/natssink", "sink_natssink.txt"},
		{"github.com/outboxkit/outbox/outboxpgx/cdc", "outboxpgx_cdc.txt"},
	} {
		got, err := apilist.FileName("github.com/outboxkit/outbox", c.pkg)
		if err != nil || got != c.want {
			t.Errorf("FileName(%s) = %q, %v; want %q", c.pkg, got, err, c.want)
		}
	}
	for module, want := range map[string]string{
		"github.com/outboxkit/outbox/v2": "outbox.txt",
		"example.com/v2tool":             "v2tool.txt",
		"v3":                             "v3.txt",
	} {
		if got, err := apilist.FileName(module, module); err != nil || got != want {
			t.Errorf("FileName of the root of %s = %q, %v; want %q", module, got, err, want)
		}
	}
	for _, pkg := range []string{
		"github.com/outboxkit/outbox/sink_natssink", // would share a file with sink/natssink
		"github.com/outboxkit/outboxpgx",            // another module
	} {
		if got, err := apilist.FileName("github.com/outboxkit/outbox", pkg); err == nil {
			t.Errorf("FileName(%s) = %q; want an error", pkg, got)
		}
	}
}

// TestGenerateRefuses checks that Generate refuses two packages with one
// listing file, and a public package with a file only some builds hold.
func TestGenerateRefuses(t *testing.T) {
	for dir, want := range map[string]string{
		"testdata/collide":     "packages example.com/collide and example.com/collide/collide both map to api/collide.txt",
		"testdata/constrained": "package example.com/constrained has later.go, which build constraints exclude",
	} {
		recordInputs(t, dir)
		_, err := apilist.Generate(dir)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Generate(%s) = %v; want an error with %q", dir, err, want)
		}
	}
}
