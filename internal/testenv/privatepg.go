package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PrivatePostgres is a throwaway PostgreSQL cluster of one test's own,
// for faults the shared server must not suffer (an immediate restart): made
// with initdb in a temporary directory, with wal_level = logical, on a free
// port of 127.0.0.1 and a unix socket in that directory. It is stopped and
// removed when the test ends.
type PrivatePostgres struct {
	t    testing.TB
	bin  string // the directory of initdb, pg_ctl, postgres
	dir  string
	data string
	port int
	as   *user.User // the OS user the server runs as; nil: this process's
}

// installPostgres says how to get the server binaries.
const installPostgres = "install them with: apt-get install postgresql (or set PATH-independent binaries under /usr/lib/postgresql/<version>/bin)"

// StartPrivatePostgres makes and starts a cluster. It fails the test, with
// how to install them, when PostgreSQL's server binaries are missing.
// Running as root, the server runs as the OS user postgres (PostgreSQL
// refuses root).
func StartPrivatePostgres(t testing.TB) *PrivatePostgres {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		if p, err := exec.LookPath("initdb"); err == nil {
			bins = []string{p}
		}
	}
	if len(bins) == 0 {
		t.Fatalf("this test needs a PostgreSQL cluster of its own, and initdb was found neither under /usr/lib/postgresql/*/bin nor on PATH: %s", installPostgres)
	}
	// The newest version: /usr/lib/postgresql/<major>/bin.
	slices.SortFunc(bins, func(a, b string) int { return majorOf(a) - majorOf(b) })
	p := &PrivatePostgres{t: t, bin: filepath.Dir(bins[len(bins)-1])}
	dir, err := os.MkdirTemp("", "outbox-pg-")
	if err != nil {
		t.Fatal(err)
	}
	p.dir, p.data = dir, filepath.Join(dir, "data")
	t.Cleanup(func() {
		p.Stop()
		os.RemoveAll(dir)
	})
	if os.Getuid() == 0 {
		if p.as, err = user.Lookup("postgres"); err != nil {
			t.Fatalf("running as root, the private PostgreSQL needs the OS user postgres to run as: %v; %s", err, installPostgres)
		}
		uid, _ := strconv.Atoi(p.as.Uid)
		gid, _ := strconv.Atoi(p.as.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	p.port = freePort(t)
	p.run("initdb", "-D", p.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
wal_level = logical
max_replication_slots = 10
max_wal_senders = 10
max_prepared_transactions = 10
max_connections = 50
shared_buffers = 32MB
fsync = off
`, p.port, dir)
	f, err := os.OpenFile(filepath.Join(p.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	p.pgCtl("start")
	return p
}

// majorOf is the major version in /usr/lib/postgresql/<major>/bin/initdb
// (0 when there is none).
func majorOf(path string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return n
}

// freePort returns a TCP port of 127.0.0.1 nobody listens on.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// URL is the cluster's URL of database postgres as the superuser.
func (p *PrivatePostgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// Restart restarts the cluster: with immediate, as after a crash (no
// shutdown checkpoint, every connection cut, crash recovery at start). It
// returns once the server accepts connections again.
func (p *PrivatePostgres) Restart(immediate bool) {
	p.t.Helper()
	mode := "fast"
	if immediate {
		mode = "immediate"
	}
	p.pgCtl("restart", "-m", mode)
}

// Stop stops the cluster at once; it does nothing when it is not running.
func (p *PrivatePostgres) Stop() {
	if _, err := os.Stat(filepath.Join(p.data, "postmaster.pid")); err != nil {
		return
	}
	cmd := p.command("pg_ctl", "-D", p.data, "-m", "immediate", "-w", "stop")
	if out, err := cmd.CombinedOutput(); err != nil {
		p.t.Logf("stop the private PostgreSQL: %v: %s", err, out)
	}
}

// pgCtl runs pg_ctl action, waiting for it, with the server's log in the
// cluster's directory.
func (p *PrivatePostgres) pgCtl(action string, args ...string) {
	p.t.Helper()
	p.run("pg_ctl", append([]string{"-D", p.data, "-l", filepath.Join(p.dir, "log"), "-w", "-t", "60", action}, args...)...)
	// pg_ctl -w returns once the server accepts connections.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		p.t.Fatalf("private PostgreSQL after pg_ctl %s: %v; log:\n%s", action, err, p.log())
	}
	conn.Close(ctx)
}

// run runs one of the server's programs as the server's user, failing the
// test with its output when it fails.
func (p *PrivatePostgres) run(prog string, args ...string) {
	p.t.Helper()
	out, err := p.command(prog, args...).CombinedOutput()
	if err != nil {
		p.t.Fatalf("%s %s: %v: %s\nlog:\n%s", prog, strings.Join(args, " "), err, out, p.log())
	}
}

func (p *PrivatePostgres) command(prog string, args ...string) *exec.Cmd {
	path := filepath.Join(p.bin, prog)
	if p.as == nil {
		return exec.Command(path, args...)
	}
	return exec.Command("runuser", append([]string{"-u", p.as.Username, "--", path}, args...)...)
}

// log returns the server's log, if any.
func (p *PrivatePostgres) log() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "log"))
	return string(b)
}
