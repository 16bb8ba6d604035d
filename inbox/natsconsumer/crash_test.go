package natsconsumer_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
)

// proc is a consumer process started from this test binary (see child).
type proc struct {
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
	err  error
}

// spawn starts a consumer process on durable of f's stream as consumer
// name, with an optional fault.
func (f *fixture) spawn(t *testing.T, durable, name, fault string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1", envSchema+"="+f.tbl.Schema, envStream+"="+f.stream,
		envDurable+"="+durable, envConsumer+"="+name, envFault+"="+fault)
	p := &proc{cmd: cmd, out: &testenv.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("consumer process output:\n%s", p.out.String())
		}
	})
	return p
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// waitKilled waits for the process to die by SIGKILL.
func (p *proc) waitKilled(t *testing.T, timeout time.Duration) {
	t.Helper()
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
	default:
		select {
		case <-p.done:
		case <-timer.C:
			t.Fatalf("consumer process still running after %s; output:\n%s", timeout, p.out.String())
		}
	}
	ee, ok := p.err.(*exec.ExitError)
	if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("consumer process ended with %v, want death by SIGKILL; output:\n%s", p.err, p.out.String())
	}
}

var report = regexp.MustCompile(`processed=(\d+) duplicate=(\d+)`)

// terminate stops the process with SIGTERM and returns its report.
func (p *proc) terminate(t *testing.T) (processed, duplicates int) {
	t.Helper()
	await.Eventually(t, 60*time.Second, func() error {
		if out := p.out.String(); !strings.Contains(out, "ready") {
			return errors.New("consumer process not ready: " + out)
		}
		return nil
	})
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("consumer process did not stop on SIGTERM; output:\n%s", p.out.String())
	}
	if p.err != nil {
		t.Fatalf("consumer process: %v; output:\n%s", p.err, p.out.String())
	}
	m := report.FindStringSubmatch(p.out.String())
	if m == nil {
		t.Fatalf("no report in the consumer process's output:\n%s", p.out.String())
	}
	processed, _ = strconv.Atoi(m[1])
	duplicates, _ = strconv.Atoi(m[2])
	return processed, duplicates
}

// TestKilledAfterCommitBeforeAck SIGKILLs a consumer process right after
// its transaction committed and before it acknowledged: the message comes
// back, and the next process acknowledges it as a duplicate without a
// second effect.
func TestKilledAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cons := f.durable(t, "billing", 2*time.Second)
	id := newID()
	f.publish(t, "order", id, "42", []byte(`{}`), true)
	f.spawn(t, "billing", "billing", "after-commit").waitKilled(t, 60*time.Second)
	if got := f.effects(t, "billing"); got[id] != 1 {
		t.Fatalf("after the kill: effects %v, want the committed one", got)
	}
	p := f.spawn(t, "billing", "billing", "")
	await.Eventually(t, 60*time.Second, drained(t, cons))
	processed, dups := p.terminate(t)
	if processed != 0 || dups != 1 {
		t.Fatalf("restarted process: %d processed, %d duplicates; want 0 and 1 (the redelivery)", processed, dups)
	}
	if got := f.effects(t, "billing"); got[id] != 1 || len(got) != 1 {
		t.Fatalf("effects %v, want exactly one", got)
	}
}

// TestKilledBeforeCommit SIGKILLs a consumer process inside its handler's
// transaction, after the write and before the commit: nothing took effect,
// and after redelivery the effect happens exactly once.
func TestKilledBeforeCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cons := f.durable(t, "billing", 2*time.Second)
	id := newID()
	f.publish(t, "order", id, "42", []byte(`{}`), true)
	f.spawn(t, "billing", "billing", "before-commit").waitKilled(t, 60*time.Second)
	if got := f.effects(t, "billing"); len(got) != 0 {
		t.Fatalf("after the kill: effects %v, want none (the transaction never committed)", got)
	}
	p := f.spawn(t, "billing", "billing", "")
	await.Eventually(t, 60*time.Second, drained(t, cons))
	processed, dups := p.terminate(t)
	if processed != 1 || dups != 0 {
		t.Fatalf("restarted process: %d processed, %d duplicates; want 1 and 0", processed, dups)
	}
	if got := f.effects(t, "billing"); got[id] != 1 || len(got) != 1 {
		t.Fatalf("effects %v, want exactly one", got)
	}
}

// TestKilledProcessesManyEvents runs two consumer processes that SIGKILL
// themselves after a commit now and then, restarting each one that dies,
// over a few hundred events: every event takes effect exactly once.
func TestKilledProcessesManyEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cons := f.durable(t, "billing", 2*time.Second)
	const n = 300
	for i := range n {
		f.publish(t, "order", newID(), fmt.Sprint("agg-", i%20), []byte(`{}`), true)
	}
	procs := []*proc{f.spawn(t, "billing", "billing", "chaos"), f.spawn(t, "billing", "billing", "chaos")}
	kills := 0
	deadline := time.Now().Add(90 * time.Second)
	for len(f.effects(t, "billing")) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events took effect after %d kills", len(f.effects(t, "billing")), n, kills)
		}
		for i, p := range procs {
			select {
			case <-p.done:
				p.waitKilled(t, 0)
				kills++
				procs[i] = f.spawn(t, "billing", "billing", "chaos")
			default:
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, p := range procs {
		p.kill()
	}
	final := f.spawn(t, "billing", "billing", "")
	await.Eventually(t, 60*time.Second, drained(t, cons))
	final.terminate(t)
	got := f.effects(t, "billing")
	for id, k := range got {
		if k != 1 {
			t.Fatalf("event %s took effect %d times", id, k)
		}
	}
	if len(got) != n {
		t.Fatalf("%d events took effect, want %d", len(got), n)
	}
	if kills == 0 {
		t.Fatal("no consumer process was killed: the test proved nothing")
	}
	t.Logf("%d events, each applied once, across %d SIGKILLs after a commit", n, kills)
}
