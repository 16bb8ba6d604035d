package main

import (
	"bytes"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the --help blocks of docs/cli.md from the commands")

// helpBlock is one fenced block of docs/cli.md that starts with the line
// "$ outbox <command...> --help".
var helpBlock = regexp.MustCompile("(?s)```\n\\$ outbox ([a-z ]+?) --help\n(.*?)```\n")

// TestCLIDocsShowTheCommandsHelp holds docs/cli.md to the commands: every
// block that shows "$ outbox ... --help" must be what that command prints.
// Run with -update-docs to rewrite the blocks after changing a command.
func TestCLIDocsShowTheCommandsHelp(t *testing.T) {
	const path = "../../docs/cli.md"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	blocks := helpBlock.FindAllStringSubmatchIndex(doc, -1)
	if len(blocks) < 10 {
		t.Fatalf("docs/cli.md: found %d help blocks, want every command's (demo, migrate, relay, status, dlq ..., console, bench)", len(blocks))
	}
	var out strings.Builder
	last := 0
	for _, b := range blocks {
		args := strings.Fields(doc[b[2]:b[3]])
		want := helpText(t, args)
		got := doc[b[4]:b[5]]
		if got != want {
			if !*updateDocs {
				t.Errorf("docs/cli.md: the block for 'outbox %s --help' differs from the command's help; run go test ./cmd/outbox -run TestCLIDocs -update-docs\n--- docs\n%s\n--- command\n%s", strings.Join(args, " "), got, want)
			}
		}
		out.WriteString(doc[last:b[4]])
		out.WriteString(want)
		last = b[5]
	}
	out.WriteString(doc[last:])
	if *updateDocs && out.String() != doc {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Log("docs/cli.md rewritten")
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
