package gobuild_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/gobuild"
)

// TestLintVetsWithTheSameSettings fails when .ci/lint's go vet compiles with
// other settings than the builds of this package: the tests' builds would
// then compile every package a second time.
func TestLintVetsWithTheSameSettings(t *testing.T) {
	lint, err := os.ReadFile("../../.ci/lint")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join(gobuild.Env, " ") + " go vet " + strings.Join(gobuild.Flags, " ") + " ./..."
	m := regexp.MustCompile(`(?m)^[^#\n]*go vet .*$`).FindAllString(string(lint), -1)
	if len(m) != 1 || strings.TrimSpace(m[0]) != want {
		t.Fatalf(".ci/lint runs go vet as %q, want %q", m, want)
	}
}

// TestCommand checks the command line and the environment Command builds.
func TestCommand(t *testing.T) {
	cmd := gobuild.Command(t.Context(), "some/dir", "-o", "bin", "./cmd/outbox")
	if got, want := strings.Join(cmd.Args[1:], " "), "build -trimpath -o bin ./cmd/outbox"; got != want {
		t.Errorf("args %q, want %q", got, want)
	}
	if cmd.Dir != "some/dir" {
		t.Errorf("dir %q", cmd.Dir)
	}
	if last := cmd.Env[len(cmd.Env)-1]; last != "CGO_ENABLED=0" {
		t.Errorf("the environment ends with %q, want CGO_ENABLED=0 (the last setting wins)", last)
	}
}
