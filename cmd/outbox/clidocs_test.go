package main

import (
	"bytes"
	"flag"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the --help blocks of docs/cli.md from the commands")

// cliDocs is docs/cli.md, relative to this package.
const cliDocs = "../../docs/cli.md"

// helpBlock is one fenced block of docs/cli.md that starts with the line
// "$ outbox <command...> --help" ("$ outbox --help" for the root).
var helpBlock = regexp.MustCompile("(?s)```\n\\$ outbox ((?:[a-z0-9-]+ )*)--help\n(.*?)```\n")

// TestCLIDocsShowTheCommandsHelp holds docs/cli.md to the commands: every
// block that shows "$ outbox ... --help" must be what that command prints.
// Run with -update-docs to rewrite the blocks after changing a command.
func TestCLIDocsShowTheCommandsHelp(t *testing.T) {
	raw, err := os.ReadFile(cliDocs)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	blocks := helpBlock.FindAllStringSubmatchIndex(doc, -1)
	if len(blocks) == 0 {
		t.Fatal("docs/cli.md: no \"$ outbox ... --help\" block")
	}
	var out strings.Builder
	last := 0
	for _, b := range blocks {
		args := strings.Fields(doc[b[2]:b[3]])
		want := helpText(t, args)
		got := doc[b[4]:b[5]]
		if got != want {
			if !*updateDocs {
				t.Errorf("docs/cli.md: the block for '%s --help' differs from the command's help; run go test ./cmd/outbox -run TestCLIDocs -update-docs\n--- docs\n%s\n--- command\n%s", strings.Join(append([]string{"outbox"}, args...), " "), got, want)
			}
		}
		out.WriteString(doc[last:b[4]])
		out.WriteString(want)
		last = b[5]
	}
	out.WriteString(doc[last:])
	if *updateDocs && out.String() != doc {
		if err := os.WriteFile(cliDocs, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Log("docs/cli.md rewritten")
	}
}

// TestCLIDocsCoverEveryCommand walks the command tree and holds
// docs/cli.md to it: every command has a "$ outbox ... --help" block, and
// every block names a command. Cobra's own help and completion commands
// are left out: cobra adds them, and docs/cli.md says how to use them.
// A new command needs its section written by hand (what it is for, in a
// few lines) with an empty block "```\n$ outbox NEW --help\n```", which
// -update-docs then fills.
func TestCLIDocsCoverEveryCommand(t *testing.T) {
	raw, err := os.ReadFile(cliDocs)
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, m := range helpBlock.FindAllStringSubmatch(string(raw), -1) {
		documented = append(documented, strings.Join(append([]string{"outbox"}, strings.Fields(m[1])...), " "))
	}
	commands := commandPaths(newRoot())
	if len(commands) < 20 {
		t.Fatalf("found %d commands in the tree, fewer than outbox has: %q", len(commands), commands)
	}
	for _, c := range commands {
		if !slices.Contains(documented, c) {
			t.Errorf("docs/cli.md has no block \"$ %s --help\": add a section for it (see this test's comment)", c)
		}
	}
	for _, d := range documented {
		if !slices.Contains(commands, d) {
			t.Errorf("docs/cli.md shows \"$ %s --help\", which is no command of outbox", d)
		}
	}
}

// commandPaths returns the full name of c and of every command under it
// ("outbox", "outbox dlq", "outbox dlq list", ...), but cobra's own help
// and completion commands and hidden ones.
func commandPaths(c *cobra.Command) []string {
	if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
		return nil
	}
	paths := []string{c.CommandPath()}
	for _, sub := range c.Commands() {
		paths = append(paths, commandPaths(sub)...)
	}
	return paths
}

// TestCommandPathsLeaveOutCobrasCommands pins what commandPaths skips: the
// help and completion commands cobra adds when a command runs.
func TestCommandPathsLeaveOutCobrasCommands(t *testing.T) {
	root := newRoot()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	paths := commandPaths(root)
	for _, skipped := range []string{"outbox help", "outbox completion", "outbox completion bash"} {
		if slices.Contains(paths, skipped) {
			t.Errorf("commandPaths lists %q", skipped)
		}
	}
	for _, kept := range []string{"outbox", "outbox dlq show", "outbox audit prune", "outbox console user add"} {
		if !slices.Contains(paths, kept) {
			t.Errorf("commandPaths lacks %q: %q", kept, paths)
		}
	}
}

// helpText is what "outbox ARGS --help" prints.
func helpText(t *testing.T, args []string) string {
	t.Helper()
	root := newRoot()
	var buf bytes.Buffer
	root.SetOut(&buf)
	root.SetErr(&buf)
	root.SetArgs(append(append([]string{}, args...), "--help"))
	if err := root.Execute(); err != nil {
		t.Fatalf("outbox %s --help: %v", strings.Join(args, " "), err)
	}
	return buf.String()
}
