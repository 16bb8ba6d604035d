// Package gobuild holds how the project builds its binaries without the
// race detector: without cgo and with -trimpath, as the container image
// ships the outbox command (deploy/image). The tests' own builds (the
// outbox command, the documentation's snippets, the API listing's go list)
// and the lint's go vet (.ci/lint) use the same settings, so that one
// compile of the module and its dependencies serves them all: a build with
// other settings compiles every package again, minutes on a fresh machine.
package gobuild

import (
	"context"
	"os"
	"os/exec"
	"slices"
)

// Env is what a build adds to the environment: no cgo, so that the binary
// is static (the SQLite driver, modernc.org/sqlite, is pure Go).
var Env = []string{"CGO_ENABLED=0"}

// Flags are the build flags every such build passes: no machine paths in
// the binary.
var Flags = []string{"-trimpath"}

// Command returns `go build` with Flags, then args, to run in dir (the
// current directory when empty) with Env added to this process's
// environment.
func Command(ctx context.Context, dir string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "go", slices.Concat([]string{"build"}, Flags, args)...)
	cmd.Dir = dir
	cmd.Env = Environ()
	return cmd
}

// Environ is this process's environment with Env added.
func Environ() []string {
	return append(os.Environ(), Env...)
}
