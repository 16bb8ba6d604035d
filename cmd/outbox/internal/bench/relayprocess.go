package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outboxkit/outbox/relay"
)

// relayProcess is `outbox relay` running as a child process.
type relayProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startRelayProcess starts the relay as a child process and waits until it
// holds the table's partitions.
func (s *deliverSetup) startRelayProcess(ctx context.Context, cfg Config, source string, poll time.Duration, env ...string) (*relayProcess, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("bench: Config.RelayBinary needs Config.DatabaseURL")
	}
	args := append([]string{"relay", "--db", cfg.DatabaseURL, "--schema", s.table.Schema, "--table", s.table.Name,
		"--route-replacement", s.broker.Destination(), "--poll-interval", poll.String(),
		"--batch", strconv.Itoa(cfg.Batch), "--lanes", strconv.Itoa(cmp.Or(cfg.Lanes, relay.DefaultLanes)), "--linger", cfg.Linger.String(), "--log-level", "error"},
		s.broker.RelayArgs()...)
	leases := `SELECT count(*) FROM ` + s.names.Leases + ` WHERE owner IS NOT NULL AND expires_at > clock_timestamp()`
	if source == SourceCDC {
		args = append(args, "--source", "cdc")
		leases = `SELECT count(*) FROM ` + s.table.Qualified("_cdc") + ` WHERE owner IS NOT NULL AND expires_at > clock_timestamp()`
	}
	cmd := exec.Command(cfg.RelayBinary, args...)
	cmd.Env = append(os.Environ(), env...)
	if e, ok := s.broker.(relayEnver); ok {
		cmd.Env = append(cmd.Env, e.RelayEnv()...)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start the relay process: %w", err)
	}
	p := &relayProcess{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	err := waitFor(ctx, time.Minute, func() bool {
		select {
		case <-p.done:
			return true
		default:
		}
		var n int
		err := s.pool.QueryRow(ctx, leases).Scan(&n)
		return err == nil && n > 0
	})
	select {
	case <-p.done:
		return nil, errors.New("bench: the relay process exited at start")
	default:
	}
	if err != nil {
		p.stop()
		return nil, fmt.Errorf("bench: the relay process took no partition: %w", err)
	}
	return p, nil
}

// cpu is the relay process's CPU time so far (user and system), from
// /proc/<pid>/stat; 0 where it cannot be read.
func (p *relayProcess) cpu() time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses: utime and
	// stime are the 12th and 13th of them, in USER_HZ ticks (100/s).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// peakRSS is the relay process's peak resident set size in MiB (VmHWM of
// /proc/<pid>/status); 0 where it cannot be read.
func (p *relayProcess) peakRSS() float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// stop stops the relay with SIGTERM, as an operator would.
func (p *relayProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
