package natsconsumer_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/gobuild"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// buildCLI builds the outbox command into a temporary directory.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "outbox")
	cmd := gobuild.Command(t.Context(), "", "-o", bin, "github.com/outboxkit/outbox/cmd/outbox")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the outbox command: %v\n%s", err, out)
	}
	return bin
}

// startRelay starts `outbox relay` on f's schema and stream.
func (f *fixture) startRelay(t *testing.T, bin string) *proc {
	t.Helper()
	cmd := exec.Command(bin, "relay", "--db", testenv.DatabaseURL(), "--schema", f.tbl.Schema, "--table", "outbox",
		"--sink", testenv.NATSURL(), "--nats-stream", f.stream, "--nats-no-create-stream",
		"--route-replacement", f.stream+".${routedByValue}",
		"--lease-ttl", "1s", "--poll-interval", "100ms", "--batch", "50", "--retry-base", "50ms", "--retry-max", "500ms")
	cmd.Env = os.Environ()
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
			t.Logf("relay output:\n%s", p.out.String())
		}
	})
	return p
}

// TestEndToEndChaos: writers commit orders, each with an OrderPlaced event
// written through the outbox in the order's transaction (some roll back);
// the relay (the real `outbox relay` command) and two consumer processes
// are SIGKILLed at random moments and restarted, and the consumers also
// kill themselves now and then right after a commit. At the end every
// committed order has exactly one effect and no rolled-back order has one.
func TestEndToEndChaos(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)
	f := newFixture(t)
	ctx := testenv.Context(t, 3*time.Minute)
	obTable := outboxdriver.Table{Schema: f.tbl.Schema, Name: "outbox"}
	if _, err := outboxpgx.New(f.pool).Migrate(ctx, obTable, nil); err != nil {
		t.Fatal(err)
	}
	orders := outboxdriver.QuoteIdent(f.tbl.Schema) + ".orders"
	if _, err := f.pool.Exec(ctx, `CREATE TABLE `+orders+` (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outboxpgx.New(f.pool), &outbox.Config{Schema: obTable.Schema, Table: obTable.Name})
	if err != nil {
		t.Fatal(err)
	}
	cons := f.durable(t, "billing", 2*time.Second)

	// Writers: each order commits with its event, or rolls back with it.
	var (
		mu        sync.Mutex
		committed = map[string]bool{}
		rolled    = map[string]bool{}
	)
	stopWriting := make(chan struct{})
	var writers sync.WaitGroup
	const perWriter = 150
	for range 4 {
		writers.Go(func() {
			for range perWriter {
				select {
				case <-stopWriting:
					return
				default:
				}
				id := uuid.NewString()
				rollback := rand.IntN(10) == 0
				err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (id) VALUES ($1)`, id); err != nil {
						return err
					}
					if err := ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "OrderPlaced",
						Payload: []byte(fmt.Sprintf(`{"order":%q}`, id))}); err != nil {
						return err
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				mu.Lock()
				switch {
				case err == nil:
					committed[id] = true
				case errors.Is(err, errRollback):
					rolled[id] = true
				default:
					mu.Unlock()
					t.Errorf("write order: %v", err)
					return
				}
				mu.Unlock()
				time.Sleep(time.Duration(10+rand.IntN(60)) * time.Millisecond) // spread over the chaos
			}
		})
	}
	stopWriters := sync.OnceFunc(func() {
		close(stopWriting)
		writers.Wait()
	})
	defer stopWriters()

	relay := f.startRelay(t, bin)
	consumers := []*proc{f.spawn(t, "billing", "billing", "chaos"), f.spawn(t, "billing", "billing", "chaos")}
	relayKills, consumerKills, selfKills := 0, 0, 0
	chaosEnd := time.Now().Add(8 * time.Second)
	for time.Now().Before(chaosEnd) {
		time.Sleep(time.Duration(200+rand.IntN(500)) * time.Millisecond)
		for i, p := range consumers {
			select {
			case <-p.done: // killed itself after a commit
				p.waitKilled(t, 0)
				selfKills++
				consumers[i] = f.spawn(t, "billing", "billing", "chaos")
			default:
			}
		}
		if k := rand.IntN(3); k == 2 {
			relay.kill()
			relayKills++
			relay = f.startRelay(t, bin)
		} else {
			consumers[k].kill()
			consumerKills++
			consumers[k] = f.spawn(t, "billing", "billing", "chaos")
		}
	}
	stopWriters()
	for _, p := range consumers {
		p.kill()
	}
	final := f.spawn(t, "billing", "billing", "")
	mu.Lock()
	want := len(committed)
	mu.Unlock()
	await.Eventually(t, 120*time.Second, func() error {
		if got := len(f.effects(t, "billing")); got < want {
			return fmt.Errorf("%d of %d committed orders have an effect", got, want)
		}
		return nil
	})
	await.Eventually(t, 60*time.Second, drained(t, cons))
	final.terminate(t)

	got := f.effects(t, "billing")
	byOrder := map[string]int{}
	rows, err := f.pool.Query(ctx, `SELECT agg, count(*) FROM `+effectsTable(f.tbl.Schema)+` GROUP BY agg`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var agg string
		var n int
		if err := rows.Scan(&agg, &n); err != nil {
			t.Fatal(err)
		}
		byOrder[agg] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range committed {
		if byOrder[id] != 1 {
			t.Errorf("committed order %s has %d effects, want 1", id, byOrder[id])
		}
	}
	for id := range rolled {
		if byOrder[id] != 0 {
			t.Errorf("rolled-back order %s has %d effects, want 0", id, byOrder[id])
		}
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("event %s took effect %d times", id, n)
		}
	}
	if len(byOrder) != len(committed) {
		t.Errorf("%d orders have effects, %d committed", len(byOrder), len(committed))
	}
	if relayKills == 0 || consumerKills == 0 {
		t.Errorf("chaos killed %d relays and %d consumers: want both", relayKills, consumerKills)
	}
	t.Logf("%d orders committed, %d rolled back; %d relay and %d consumer SIGKILLs, %d consumer self-kills after a commit; every committed order applied once",
		len(committed), len(rolled), relayKills, consumerKills, selfKills)
}

var errRollback = errors.New("roll back on purpose")
