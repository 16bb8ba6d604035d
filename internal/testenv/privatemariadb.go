package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// PrivateMariaDB is a throwaway MariaDB server of one test's own, for
// faults the shared server must not suffer (SIGKILL and restart): made
// with mariadb-install-db in a temporary directory, with a row-based
// binary log of full row images, on a free port of 127.0.0.1 and a unix
// socket in that directory, run as a child process of the test. It is
// killed and removed when the test ends.
type PrivateMariaDB struct {
	t     testing.TB
	bin   string // mariadbd
	dir   string
	port  int
	as    string // the OS user the server runs as
	cmd   *exec.Cmd
	done  chan struct{}
	extra []string // server options of the test's
}

const installMariaDB = "install it with: apt-get install mariadb-server"

// StartPrivateMariaDB makes and starts a server, with the server options
// extra besides its own. It fails the test, with how to install them,
// when MariaDB's server binaries are missing.
func StartPrivateMariaDB(t testing.TB, extra ...string) *PrivateMariaDB {
	t.Helper()
	install, err := exec.LookPath("mariadb-install-db")
	if err != nil {
		t.Fatalf("this test needs a MariaDB server of its own, and mariadb-install-db is not on PATH: %s", installMariaDB)
	}
	bin := "/usr/sbin/mariadbd"
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("mariadbd"); err != nil {
			t.Fatalf("this test needs a MariaDB server of its own, and mariadbd is neither /usr/sbin/mariadbd nor on PATH: %s", installMariaDB)
		}
	}
	dir, err := os.MkdirTemp("", "outbox-mariadb-")
	if err != nil {
		t.Fatal(err)
	}
	m := &PrivateMariaDB{t: t, bin: bin, dir: dir, port: freePort(t), extra: extra}
	t.Cleanup(func() {
		m.Kill()
		os.RemoveAll(dir)
	})
	if os.Getuid() == 0 {
		// mariadbd refuses to run as root unless told to: it runs as mysql.
		u, err := user.Lookup("mysql")
		if err != nil {
			t.Fatalf("running as root, the private MariaDB needs the OS user mysql to run as: %v; %s", err, installMariaDB)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		m.as = "mysql"
	}
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"), "--auth-root-authentication-method=normal", "--skip-test-db"}
	if m.as != "" {
		args = append(args, "--user="+m.as)
	}
	if out, err := exec.Command(install, args...).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v: %s", err, out)
	}
	m.Start()
	db := m.DB("")
	if _, err := db.Exec("CREATE DATABASE test"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	return m
}

// Start starts the server (again, after Kill) and returns once it accepts
// connections, within two minutes.
func (m *PrivateMariaDB) Start() {
	m.t.Helper()
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(m.dir, "data"),
		"--port=" + strconv.Itoa(m.port), "--bind-address=127.0.0.1", "--socket=" + filepath.Join(m.dir, "sock"),
		"--pid-file=" + filepath.Join(m.dir, "pid"), "--log-error=" + filepath.Join(m.dir, "error.log"),
		"--log-bin=mysql-bin", "--binlog-format=ROW", "--binlog-row-image=FULL", "--server-id=1",
		"--log-bin-trust-function-creators=1", "--innodb-buffer-pool-size=32M", "--max-connections=200",
		"--skip-name-resolve"}
	if m.as != "" {
		args = append(args, "--user="+m.as)
	}
	args = append(args, m.extra...)
	m.cmd = exec.Command(m.bin, args...)
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := m.cmd.Start(); err != nil {
		m.t.Fatalf("start mariadbd: %v", err)
	}
	done := make(chan struct{})
	m.done = done
	go func() { m.cmd.Wait(); close(done) }()
	db := m.DB("")
	defer db.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(m.dir, "error.log"))
			m.t.Fatalf("the private MariaDB exited at start: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("the private MariaDB did not accept connections within 2 minutes: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it
// to be gone; it does nothing when it is not running.
func (m *PrivateMariaDB) Kill() {
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	select {
	case <-m.done:
		return
	default:
	}
	m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.done
}

// Config is the go-sql-driver configuration of database name as root
// (interpolateParams and parseTime on, as MySQLConfig).
func (m *PrivateMariaDB) Config(name string) *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", fmt.Sprintf("127.0.0.1:%d", m.port), name
	cfg.InterpolateParams, cfg.ParseTime = true, true
	return cfg
}

// DB opens database name as root; the caller closes it.
func (m *PrivateMariaDB) DB(name string) *sql.DB {
	m.t.Helper()
	conn, err := mysql.NewConnector(m.Config(name))
	if err != nil {
		m.t.Fatal(err)
	}
	return sql.OpenDB(conn)
}
