package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/outboxkit/outbox/console"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// The console scenario's table: what it seeds before it times the pages.
const (
	// ConsolePending is the backlog of unpublished events.
	ConsolePending = 1_000_000
	// ConsoleDeadLetters is the number of dead letters.
	ConsoleDeadLetters = 100_000
	// ConsoleKept is the number of published events kept (retention
	// keep), which a replay selects from.
	ConsoleKept = 50_000
	// ConsoleHeld is the number of held aggregates.
	ConsoleHeld = 2_000
	// ConsoleAudit is the number of audit rows.
	ConsoleAudit = 200_000
	// ConsoleRequests is the number of replay and repair requests.
	ConsoleRequestRows = 1_000
	// ConsoleAggregates is the number of aggregates the events spread
	// over.
	ConsoleAggregates = 50_000
	// ConsoleTimed is how many timed requests each route gets.
	ConsoleTimed = 100
	// ConsoleRefresh is how often the drain part's console refreshes
	// the overview, as an open overview page does.
	ConsoleRefresh = 2 * time.Second
	// DefaultConsoleRounds is the drain part's default number of pairs
	// of drains (one without a console, one with).
	DefaultConsoleRounds = 4
)

// ConsoleFigures are the figures of one route of the console scenario.
type ConsoleFigures struct {
	// Route is the route's method and pattern; Kind is "page", "api" or
	// "background" (the console's own sampler).
	Route string `json:"route"`
	Kind  string `json:"kind"`
	// Variants are the query strings the route was asked with, in turn.
	Variants []string `json:"variants,omitempty"`
	// P95 is the 95th percentile of the latencies (nearest rank).
	P95   time.Duration `json:"-"`
	P95Ms float64       `json:"p95_ms"`
	// Bytes is the mean size of a response.
	Bytes int64 `json:"bytes"`
	// Seeded describes the table the pages were timed over.
	Seeded string `json:"seeded,omitempty"`
	// DrainRatio is, for the drain part, the drain time with a console
	// refreshing the overview over the drain time without, median of the
	// pairs; PairRatios are the pairs'.
	DrainRatio float64   `json:"drain_ratio,omitempty"`
	PairRatios []float64 `json:"pair_ratios,omitempty"`
	// Refreshes is how many overview refreshes the console answered
	// during the drains with it.
	Refreshes int64 `json:"refreshes,omitempty"`
}

// ConsoleBench seeds a table with ConsolePending unpublished events,
// ConsoleDeadLetters dead letters, held aggregates, kept published events,
// audit rows and requests, starts the console on it in this process (with
// a users file and an API token, over HTTP on the loopback) and times
// every page and every GET route of the API (taken from the OpenAPI
// document the console serves, so that none is missed) with realistic
// filters and pagination, ConsoleTimed requests each; then it drains
// cfg.Events events to the broker with one relay, in cfg.Rounds pairs of
// drains alternating which goes first, without and with a console
// refreshing the overview every ConsoleRefresh, and reports the ratio of
// the drain times.
func ConsoleBench(ctx context.Context, cfg Config) (results []Result, err error) {
	if cfg.Rounds == 0 {
		cfg.Rounds = DefaultConsoleRounds
	}
	if cfg, err = cfg.deliverDefaults(); err != nil {
		return nil, err
	}
	pages, err := consolePages(ctx, cfg)
	if err != nil {
		return nil, err
	}
	results = append(results, pages...)
	drain, err := consoleDrain(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return append(results, drain...), nil
}

// ConsoleDrainBench runs the drain part of ConsoleBench alone: enough
// pairs to resolve a cost of a few percent take longer than the pages.
func ConsoleDrainBench(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.Rounds == 0 {
		cfg.Rounds = DefaultConsoleRounds
	}
	cfg, err := cfg.deliverDefaults()
	if err != nil {
		return nil, err
	}
	return consoleDrain(ctx, cfg)
}

// consoleSite is a console served on the loopback over a table, with a
// signed-in browser and an API token.
type consoleSite struct {
	srv     *console.Server
	base    string
	browser *http.Client
	token   string
	stop    func()
	// consumerDeadLetters are ids of the seeded inbox dead letters.
	consumerDeadLetters []string
}

// startConsole serves a console over t with one operator in a users file
// written to a temporary directory, signs a browser in through the
// sign-in form and returns the operator's API token with it.
func startConsole(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table) (*consoleSite, error) {
	dir, err := os.MkdirTemp("", "outbox-bench-console-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	users := &console.Users{Cost: bcrypt.DefaultCost}
	const name, password = "bench-operator", "bench-operator-password"
	token, err := users.Add(name, ops.Operator, password)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "users.json")
	if err := users.Save(path); err != nil {
		return nil, err
	}
	if users, err = console.LoadUsers(path); err != nil {
		return nil, err
	}
	o, err := ops.New(outboxpgx.New(pool), t, &ops.Config{SensitivePaths: []string{"customer.email"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	ibx, cdls, err := consoleInbox(ctx, pool, o, t)
	if err != nil {
		return nil, err
	}
	srv, err := console.New(o, &console.Config{Users: users, Logger: slog.New(slog.DiscardHandler), Inbox: ibx})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	site := &consoleSite{srv: srv, base: "http://" + ln.Addr().String(), token: token, stop: func() { _ = hs.Close() }, consumerDeadLetters: cdls}
	jar, _ := cookiejar.New(nil)
	site.browser = &http.Client{Jar: jar, Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if err := site.signIn(ctx, name, password); err != nil {
		site.stop()
		return nil, err
	}
	return site, nil
}

var formToken = regexp.MustCompile(`name="token" value="([^"]+)"`)

// signIn signs the browser in through the sign-in form.
func (c *consoleSite) signIn(ctx context.Context, name, password string) error {
	_, body, err := c.get(ctx, "/login", false)
	if err != nil {
		return err
	}
	m := formToken.FindSubmatch(body)
	if m == nil {
		return errors.New("bench: the sign-in page has no form token")
	}
	form := url.Values{"name": {name}, "password": {password}, "token": {string(m[1])}, "next": {"/"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/login", strings.NewReader(form.Encode()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", c.base)
	resp, err := c.browser.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		return fmt.Errorf("bench: signing in to the console: %s", resp.Status)
	}
	return nil
}

// get fetches path as the browser (api false) or with the API token, and
// fails unless the answer is 200.
func (c *consoleSite) get(ctx context.Context, path string, api bool) (int64, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return 0, nil, err
	}
	if api {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.browser.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("bench: GET %s: %s: %s", path, resp.Status, oneLine(string(b), 300))
	}
	return int64(len(b)), b, nil
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

// seedConsole fills t with the scenario's table: pending events over
// ConsoleAggregates aggregates of several types, kept published events,
// dead letters with errors of several classes, held aggregates, audit rows,
// requests, two relays and an hour of samples; then VACUUM ANALYZE.
//
// With full false it adds only the dead letters, none holding its
// aggregate: a table that a relay drains.
func seedConsole(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table, pending, dead int, full bool, progress io.Writer) error {
	n := pgschema.NamesOf(t)
	// Aggregate types with a skewed spread, each with its event types.
	kinds := `(VALUES (0, 'order', ARRAY['OrderPlaced','OrderPaid','OrderShipped','OrderCancelled']),
  (1, 'order', ARRAY['OrderPlaced','OrderPaid']), (2, 'order', ARRAY['OrderPlaced','OrderShipped']),
  (3, 'order', ARRAY['OrderPlaced']), (4, 'payment', ARRAY['PaymentAuthorized','PaymentCaptured','PaymentFailed']),
  (5, 'payment', ARRAY['PaymentCaptured','PaymentRefunded']), (6, 'shipment', ARRAY['ShipmentCreated','ShipmentDelivered']),
  (7, 'shipment', ARRAY['ShipmentCreated']), (8, 'customer', ARRAY['CustomerRegistered','CustomerUpdated']),
  (9, 'invoice', ARRAY['InvoiceIssued','InvoicePaid']), (10, 'cart', ARRAY['CartUpdated']), (11, 'inventory', ARRAY['StockReserved','StockReleased']),
  (12, 'refund', ARRAY['RefundRequested']), (13, 'loyalty', ARRAY['PointsEarned'])) AS k(slot, agg, types)`
	pend, aggs, kept, dl := int64(pending), int64(ConsoleAggregates), int64(ConsoleKept), int64(dead)
	steps := []struct {
		what, sql string
		args      []any
	}{
		{"pending events", `INSERT INTO ` + n.Table + ` (id, aggregatetype, aggregateid, type, payload, headers, created_at)
SELECT gen_random_uuid(), k.agg, k.agg || '-' || (g % $2), k.types[1 + (g / 7) % cardinality(k.types)],
       jsonb_build_object('id', g, 'customer', jsonb_build_object('id', 'c-' || (g % 9973), 'email', 'c' || (g % 9973) || '@example.com'),
                          'total', round((g % 10000) / 7.0, 2), 'currency', 'EUR', 'lines', jsonb_build_array(jsonb_build_object('sku', 'sku-' || (g % 500), 'qty', 1 + g % 3))),
       jsonb_build_object('tenant', 't' || (g % 20)),
       now() - interval '6 hours' + (g * interval '6 hours') / $1
FROM generate_series(1, $1::bigint) g JOIN ` + kinds + ` ON k.slot = (g * 7919) % 14 ORDER BY g`, []any{pend, aggs}},
		{"kept published events", `INSERT INTO ` + n.Table + ` (id, aggregatetype, aggregateid, type, payload, created_at, published_at)
SELECT gen_random_uuid(), k.agg, k.agg || '-' || (g % $2), k.types[1 + (g / 7) % cardinality(k.types)],
       jsonb_build_object('id', g, 'total', round((g % 10000) / 7.0, 2)),
       now() - interval '30 hours' + (g * interval '24 hours') / $1, now() - interval '30 hours' + (g * interval '24 hours') / $1 + interval '40 ms'
FROM generate_series(1, $1::bigint) g JOIN ` + kinds + ` ON k.slot = (g * 7919) % 14 ORDER BY g`, []any{kept, aggs}},
		{"dead letters", `INSERT INTO ` + n.DeadLetter + ` (id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, attempts, last_error, dead_lettered_at, held)
SELECT gen_random_uuid(), k.agg, k.agg || '-' || (g * 31 % $2), k.types[1 + (g / 5) % cardinality(k.types)],
       jsonb_build_object('id', g, 'customer', jsonb_build_object('id', 'c-' || (g % 9973), 'email', 'c' || (g % 9973) || '@example.com'), 'total', 12.5),
       nextval(pg_get_serial_sequence($3, 'seq')), now() - interval '8 days' + (g * interval '7 days') / $1,
       jsonb_build_object('tenant', 't' || (g % 20)), 1 + g % 10,
       CASE g % 12
         WHEN 0 THEN 'nats: timeout after ' || (1000 + g % 9000) || 'ms publishing ' || gen_random_uuid()
         WHEN 1 THEN 'broker refused: 400 Bad Request'
         WHEN 2 THEN 'webhook https://hooks.example.com/orders: 503 Service Unavailable'
         WHEN 3 THEN 'kafka: MESSAGE_TOO_LARGE: the message is ' || (1048576 + g) || ' bytes'
         WHEN 4 THEN 'amqp: NO_ROUTE (312) for exchange "orders" and key ' || k.agg
         WHEN 5 THEN 'route: event ' || gen_random_uuid() || ': aggregate id is not valid UTF-8'
         WHEN 6 THEN 'contract: payload of ' || k.types[1] || ' does not match its schema: missing property "currency"'
         WHEN 7 THEN 'webhook https://hooks.example.com/payments: 410 Gone'
         WHEN 8 THEN 'nats: maximum payload exceeded'
         WHEN 9 THEN 'redis: OOM command not allowed when used memory > ''maxmemory'''
         WHEN 10 THEN 'mqtt: not authorized to publish to outbox/event/' || k.agg
         ELSE 'kafka: UNKNOWN_TOPIC_OR_PARTITION'
       END,
       now() - interval '7 days' + (g * interval '7 days') / $1, g % 50 = 0
FROM generate_series(1, $1::bigint) g JOIN ` + kinds + ` ON k.slot = (g * 7919) % 14 ORDER BY g`, []any{dl, aggs, n.Table}},
		{"held aggregates", `INSERT INTO ` + n.Held + ` (aggregatetype, aggregateid, seq, event_id, reason, held_at)
SELECT DISTINCT ON (aggregatetype, aggregateid) aggregatetype, aggregateid, seq, id, 'dead-lettered', dead_lettered_at
FROM ` + n.DeadLetter + ` WHERE held ORDER BY aggregatetype, aggregateid, seq`, nil},
		{"audit rows", `INSERT INTO ` + n.Audit + ` (at, actor, role, action, event_id, detail, reason)
SELECT now() - interval '30 days' + (g * interval '30 days') / $1,
       (ARRAY['ada','grace','linus','ken','barbara','dennis'])[1 + g % 6], (ARRAY['operator','viewer','approver'])[1 + g % 3],
       (ARRAY['retry','discard','login','login-failed','logout','denied','pause','resume','release','reveal','request','approve'])[1 + (g * 7) % 12],
       CASE WHEN g % 3 = 0 THEN gen_random_uuid() END, 'from 10.0.' || (g % 250) || '.' || (g % 200), CASE WHEN g % 2 = 0 THEN 'receiver fixed' ELSE '' END
FROM generate_series(1, $1::bigint) g`, []any{int64(ConsoleAudit)}},
		{"requests", `INSERT INTO ` + t.Qualified("_requests") + ` (id, kind, state, requester, requester_role, reason, params, created_at, expires_at, decided_by, decided_at, total, done)
SELECT gen_random_uuid(), CASE WHEN g % 4 = 0 THEN 'repair' ELSE 'replay' END,
       (ARRAY['done','done','done','rejected','expired','cancelled','failed','pending'])[1 + g % 8], 'ada', 'operator', 'consumer lost its read model',
       CASE WHEN g % 4 = 0 THEN json_build_object('event_id', gen_random_uuid(), 'payload', json_build_object('total', 12.5, 'currency', 'EUR'))
            ELSE json_build_object('since', now() - interval '2 days', 'until', now() - interval '1 day', 'aggregatetype', 'order', 'new_ids', true) END,
       now() - interval '20 days' + (g * interval '20 days') / $1, now() - interval '20 days' + (g * interval '20 days') / $1 + interval '1 hour',
       'grace', now() - interval '20 days' + (g * interval '20 days') / $1 + interval '5 minutes', 1000, CASE WHEN g % 8 < 3 THEN 1000 ELSE 0 END
FROM generate_series(1, $1::bigint) g`, []any{int64(ConsoleRequestRows)}},
		{"relays", `INSERT INTO ` + n.Relays + ` (relay, started_at, expires_at) VALUES ('relay-a', now() - interval '3 days', now() + interval '1 day'), ('relay-b', now() - interval '1 day', now() + interval '1 day')`, nil},
		{"leases", `UPDATE ` + n.Leases + ` SET owner = CASE WHEN partition % 2 = 0 THEN 'relay-a' ELSE 'relay-b' END, epoch = 3, expires_at = now() + interval '1 day'`, nil},
		{"samples", `INSERT INTO ` + t.Qualified("_samples") + ` (at, backlog, oldest_age, dead_letters, last_seq)
SELECT now() - interval '1 hour' + g * interval '15 seconds', $1 + 2400 - g * 10, 21600 + g * 15, $2, g * 1000 FROM generate_series(0, 239) g`, []any{pend, dl}},
	}
	for _, s := range steps {
		if !full && s.what != "dead letters" {
			continue
		}
		fmt.Fprintf(progress, "console: seeding %s\n", s.what)
		if _, err := pool.Exec(ctx, s.sql, s.args...); err != nil {
			return fmt.Errorf("bench: seed %s: %w", s.what, err)
		}
	}
	if !full {
		if _, err := pool.Exec(ctx, `UPDATE `+n.DeadLetter+` SET held = false`); err != nil {
			return fmt.Errorf("bench: seed dead letters: %w", err)
		}
	}
	fmt.Fprintf(progress, "console: VACUUM ANALYZE\n")
	for _, tb := range []string{n.Table, n.DeadLetter, n.Held, n.Audit, t.Qualified("_requests"), t.Qualified("_samples")} {
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+tb); err != nil {
			return fmt.Errorf("bench: vacuum %s: %w", tb, err)
		}
	}
	return nil
}

// consoleRoute is one route the scenario times and how to ask it.
type consoleRoute struct {
	route string // "GET /pattern"
	api   bool
	// variants are paths with queries, {dl} and {req} replaced by a dead
	// letter's or a request's id, in turn for each timed request.
	variants []string
}

// consoleVariants returns the requests each route is timed with, keyed by
// "GET pattern": the filters and pages an operator uses.
func consoleVariants(f fixtures) map[string][]string {
	dlFilters := []string{"", "?type=OrderPlaced", "?aggregatetype=payment", "?aggregateid=" + url.QueryEscape(f.aggregate),
		"?error=timeout", "?error=no-such-error-text", "?since=" + url.QueryEscape(f.since), "?after=" + url.QueryEscape(f.deepCursor),
		"?destination=outbox.event.shipment", "?destination=outbox.event.loyalty&type=PointsEarned", "?limit=500",
		"?type=PaymentFailed&error=broker&limit=100"}
	auditFilters := []string{"", "?action=retry", "?actor=grace&action=approve", "?event_id=" + f.auditEvent, "?before=" + f.auditBefore,
		"?since=" + url.QueryEscape(f.since) + "&action=denied", "?request_id=" + f.request, "?limit=500"}
	return map[string][]string{
		"GET /{$}":                      {"/"},
		"GET /login":                    {"/login"},
		"GET /static/{file}":            {"/static/console.css", "/static/console.js"},
		"GET /dead-letters":             prefix("/dead-letters", dlFilters),
		"GET /dead-letters/{id}":        {"/dead-letters/{dl}"},
		"GET /dead-letters/{id}/repair": {"/dead-letters/{dl}/repair"},
		"GET /audit":                    prefix("/audit", auditFilters),
		"GET /pauses":                   {"/pauses"},
		"GET /held":                     {"/held"},
		"GET /failure-groups":           {"/failure-groups"},
		"GET /requests":                 {"/requests", "/requests?state=pending", "/requests?state=done"},
		"GET /requests/{id}":            {"/requests/{req}"},
		"GET /consumers":                {"/consumers", "/consumers?consumer=" + benchConsumer},
		"GET /consumers/{consumer}/dead-letters/{id}": {"/consumers/" + benchConsumer + "/dead-letters/{cdl}"},
		"GET /replay": {"/replay", "/replay?since=" + url.QueryEscape(f.replaySince) + "&aggregatetype=order", "/replay?since=" + url.QueryEscape(f.replaySince) + "&destination=outbox.event.payment"},

		"GET /api/v1/openapi.json":      {"/api/v1/openapi.json"},
		"GET /api/v1/overview":          {"/api/v1/overview"},
		"GET /api/v1/dead-letters":      prefix("/api/v1/dead-letters", dlFilters),
		"GET /api/v1/dead-letters/{id}": {"/api/v1/dead-letters/{dl}"},
		"GET /api/v1/audit":             prefix("/api/v1/audit", auditFilters),
		"GET /api/v1/pauses":            {"/api/v1/pauses"},
		"GET /api/v1/held":              {"/api/v1/held", "/api/v1/held?limit=500"},
		"GET /api/v1/failure-groups":    {"/api/v1/failure-groups", "/api/v1/failure-groups?limit=500"},
		"GET /api/v1/requests":          {"/api/v1/requests", "/api/v1/requests?state=done&limit=500"},
		"GET /api/v1/requests/{id}":     {"/api/v1/requests/{req}"},
		"GET /api/v1/replay/preview": {"/api/v1/replay/preview?since=" + url.QueryEscape(f.replaySince),
			"/api/v1/replay/preview?since=" + url.QueryEscape(f.replaySince) + "&aggregatetype=order&type=OrderPaid",
			"/api/v1/replay/preview?since=" + url.QueryEscape(f.replaySince) + "&destination=outbox.event.customer",
			"/api/v1/replay/preview?since=" + url.QueryEscape(f.replaySince) + "&aggregateid=" + url.QueryEscape(f.aggregate)},
	}
}

func prefix(p string, qs []string) []string {
	out := make([]string, len(qs))
	for i, q := range qs {
		out[i] = p + q
	}
	return out
}

// fixtures are values of the seeded table the requests use.
type fixtures struct {
	deadLetters, requests               []string
	aggregate, since, replaySince       string
	deepCursor, auditEvent, auditBefore string
	request                             string
	// consumerDeadLetters are ids of benchConsumer's dead letters in the
	// inbox table (consoleInbox).
	consumerDeadLetters []string
}

// benchConsumer is the consumer whose inbox dead letters the console
// scenario seeds, and ConsoleConsumerDeadLetters how many.
const (
	benchConsumer              = "bench-consumer"
	ConsoleConsumerDeadLetters = 10000
)

// consoleInbox migrates the inbox table beside t, seeds benchConsumer's
// dead letters (a payload as the outbox's events carry), and returns the
// ops.Inbox the console shows and a sample of the dead letters' ids.
func consoleInbox(ctx context.Context, pool *pgxpool.Pool, o *ops.Ops, t outboxdriver.Table) (*ops.Inbox, []string, error) {
	it := outboxdriver.Table{Schema: t.Schema, Name: t.Name + "_inbox"}
	if _, err := inboxpgx.Migrate(ctx, pool, it); err != nil {
		return nil, nil, fmt.Errorf("bench: migrate the inbox table: %w", err)
	}
	dl := it.Qualified("_dead_letter")
	if _, err := pool.Exec(ctx, `INSERT INTO `+dl+` (consumer, event_id, aggregatetype, aggregateid, type, destination, payload, error)
SELECT $1, gen_random_uuid()::text, 'order', 'order-' || (g % 500), 'OrderPlaced', 'outbox.event.order',
       convert_to(json_build_object('n', g, 'customer', json_build_object('email', 'c' || g || '@example.com'))::text, 'UTF8'),
       'handler: timeout after 3 attempts'
FROM generate_series(1, $2) AS g`, benchConsumer, ConsoleConsumerDeadLetters); err != nil {
		return nil, nil, fmt.Errorf("bench: seed the consumer's dead letters: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT id::text FROM `+dl+` TABLESAMPLE SYSTEM (5) LIMIT 200`)
	if err != nil {
		return nil, nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, err
	}
	if len(ids) == 0 { // the sample may miss every page of a small table
		var id string
		if err := pool.QueryRow(ctx, `SELECT min(id)::text FROM `+dl).Scan(&id); err != nil {
			return nil, nil, err
		}
		ids = []string{id}
	}
	x, err := ops.NewInbox(o, inboxpgx.New(pool), it)
	if err != nil {
		return nil, nil, err
	}
	return x, ids, nil
}

func readFixtures(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table, dead int) (fixtures, error) {
	n := pgschema.NamesOf(t)
	var f fixtures
	rows, err := pool.Query(ctx, `SELECT id::text FROM `+n.DeadLetter+` TABLESAMPLE SYSTEM (1) LIMIT 500`)
	if err != nil {
		return f, err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return f, err
		}
		f.deadLetters = append(f.deadLetters, id)
	}
	if err := rows.Err(); err != nil {
		return f, err
	}
	rows, err = pool.Query(ctx, `SELECT id::text FROM `+t.Qualified("_requests")+` LIMIT 200`)
	if err != nil {
		return f, err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return f, err
		}
		f.requests = append(f.requests, id)
	}
	if len(f.deadLetters) == 0 || len(f.requests) == 0 {
		return f, errors.New("bench: the seeded table has no dead letters or requests")
	}
	f.request = f.requests[0]
	var at time.Time
	var seq, before int64
	if err := pool.QueryRow(ctx, `SELECT aggregateid FROM `+n.DeadLetter+` WHERE id = $1`, f.deadLetters[0]).Scan(&f.aggregate); err != nil {
		return f, err
	}
	if err := pool.QueryRow(ctx, `SELECT dead_lettered_at, seq FROM `+n.DeadLetter+` ORDER BY dead_lettered_at, seq OFFSET $1 LIMIT 1`, dead/2).Scan(&at, &seq); err != nil {
		return f, err
	}
	f.deepCursor = outboxdriver.DeadLetterCursor{At: at, Seq: seq}.String()
	if err := pool.QueryRow(ctx, `SELECT coalesce(event_id::text, ''), id FROM `+n.Audit+` WHERE event_id IS NOT NULL ORDER BY id OFFSET $1 LIMIT 1`, ConsoleAudit/6).Scan(&f.auditEvent, &before); err != nil {
		return f, err
	}
	f.auditBefore = fmt.Sprint(before)
	f.since = time.Now().UTC().Add(-48 * time.Hour).Format("2006-01-02T15:04")
	f.replaySince = time.Now().UTC().Add(-26 * time.Hour).Format("2006-01-02T15:04")
	return f, nil
}

// consoleRoutes lists every route the console answers to GET: its pages
// (Server.Routes) and the GET operations of the OpenAPI document it serves.
// A route without variants is an error, so a new route cannot go untimed.
func consoleRoutes(ctx context.Context, site *consoleSite, variants map[string][]string) ([]consoleRoute, error) {
	var out []consoleRoute
	var missing []string
	add := func(key string, api bool) {
		v, ok := variants[key]
		if !ok {
			missing = append(missing, key)
			return
		}
		out = append(out, consoleRoute{route: key, api: api, variants: v})
	}
	for _, r := range site.srv.Routes() {
		if r.Method == http.MethodGet && !r.API {
			add("GET "+r.Pattern, false)
		}
	}
	_, doc, err := site.get(ctx, "/api/v1/openapi.json", false)
	if err != nil {
		return nil, err
	}
	var spec struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(doc, &spec); err != nil {
		return nil, fmt.Errorf("bench: the console's OpenAPI document: %w", err)
	}
	paths := slices.Sorted(func(yield func(string) bool) {
		for p := range spec.Paths {
			if !yield(p) {
				return
			}
		}
	})
	for _, p := range paths {
		if _, ok := spec.Paths[p]["get"]; ok {
			add("GET "+p, true)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("bench: the console answers %s, which the console scenario does not time: add them to consoleVariants", strings.Join(missing, ", "))
	}
	return out, nil
}

// timeConsole times every route of a console over the seeded table t.
func timeConsole(ctx context.Context, cfg Config, t outboxdriver.Table, env *Env) ([]Result, error) {
	var results []Result
	f, err := readFixtures(ctx, cfg.Pool, t, ConsoleDeadLetters)
	if err != nil {
		return nil, err
	}
	site, err := startConsole(ctx, cfg.Pool, t)
	if err != nil {
		return nil, err
	}
	defer site.stop()
	f.consumerDeadLetters = site.consumerDeadLetters
	routes, err := consoleRoutes(ctx, site, consoleVariants(f))
	if err != nil {
		return nil, err
	}
	seeded := fmt.Sprintf("%d pending events over %d aggregates, %d dead letters, %d kept published, %d held aggregates, %d audit rows, %d requests",
		ConsolePending, ConsoleAggregates, ConsoleDeadLetters, ConsoleKept, ConsoleHeld, ConsoleAudit, ConsoleRequestRows)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, r := range routes {
		var rec Recorder
		var bytes int64
		for i := range ConsoleTimed + 3 { // the first 3 warm up
			p := r.variants[i%len(r.variants)]
			p = strings.ReplaceAll(p, "{dl}", f.deadLetters[rng.IntN(len(f.deadLetters))])
			p = strings.ReplaceAll(p, "{req}", f.requests[rng.IntN(len(f.requests))])
			p = strings.ReplaceAll(p, "{cdl}", f.consumerDeadLetters[rng.IntN(len(f.consumerDeadLetters))])
			t0 := time.Now()
			nb, _, err := site.get(ctx, p, r.api)
			if err != nil {
				return nil, err
			}
			if i >= 3 {
				rec.Record(time.Since(t0))
				bytes += nb
			}
		}
		results = append(results, consoleResult(r, &rec, bytes, env, seeded))
		fmt.Fprintf(cfg.Progress, "console: %-34s p50 %6s ms  p95 %6s ms\n", r.route, fmtMs(results[len(results)-1].Latency.P50), fmtMs(results[len(results)-1].Console.P95))
	}
	// The console's own sampler, every SampleEvery in the background.
	var rec Recorder
	for range ConsoleTimed / 4 {
		t0 := time.Now()
		if err := site.srv.SampleOnce(ctx); err != nil {
			return nil, err
		}
		rec.Record(time.Since(t0))
	}
	results = append(results, consoleResult(consoleRoute{route: "sample (every 15 s)"}, &rec, 0, env, seeded))
	results[len(results)-1].Console.Kind = "background"
	return results, nil
}

// consolePages seeds the table and times every route.
func consolePages(ctx context.Context, cfg Config) ([]Result, error) {
	env, err := ReadEnv(ctx, cfg.Pool)
	if err != nil {
		return nil, err
	}
	env.Rounds = 1
	schema, drop, err := freshSchema(ctx, cfg.Pool, cfg.Schema)
	if err != nil {
		return nil, err
	}
	var results []Result
	err = func() error {
		t := outboxdriver.Table{Schema: schema, Name: "outbox"}
		versions, err := outboxpgx.New(cfg.Pool).Migrate(ctx, t, nil)
		if err != nil {
			return err
		}
		env.SchemaVersion = versions[len(versions)-1]
		t0 := time.Now()
		if err := seedConsole(ctx, cfg.Pool, t, ConsolePending, ConsoleDeadLetters, true, cfg.Progress); err != nil {
			return err
		}
		fmt.Fprintf(cfg.Progress, "console: seeded in %s\n", time.Since(t0).Round(time.Second))
		results, err = timeConsole(ctx, cfg, t, env)
		return err
	}()
	return results, errors.Join(err, drop())
}

func consoleResult(r consoleRoute, rec *Recorder, bytes int64, env *Env, seeded string) Result {
	n := rec.Len()
	sorted := slices.Clone(rec.samples)
	slices.Sort(sorted)
	lat := rec.Summary()
	kind := "page"
	if r.api {
		kind = "api"
	}
	f := &ConsoleFigures{Route: r.route, Kind: kind, Variants: r.variants, P95: percentile(sorted, 0.95), Seeded: seeded}
	f.P95Ms = ms(f.P95)
	if n > 0 {
		f.Bytes = bytes / int64(n)
	}
	return Result{Scenario: "console", Case: r.route, Workers: 1, Unit: "request", Ops: int64(n), Seconds: lat.Mean.Seconds() * float64(n),
		PerSecond: float64(n) / max(lat.Mean.Seconds()*float64(n), 1e-9), Latency: lat, Console: f, Env: env}
}

// consoleDrain drains cfg.Events events with one relay, in cfg.Rounds
// pairs, without and with a console refreshing the overview.
func consoleDrain(ctx context.Context, cfg Config) (results []Result, err error) {
	s, cleanup, err := newDeliverSetup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	s.env.Rounds = cfg.Rounds
	n := cfg.Events
	// The overview counts dead letters and held aggregates too: give the
	// table the scenario's dead letters.
	if err := seedConsole(ctx, cfg.Pool, s.table, 0, ConsoleDeadLetters, false, io.Discard); err != nil {
		return nil, err
	}
	site, err := startConsole(ctx, cfg.Pool, s.table)
	if err != nil {
		return nil, err
	}
	defer site.stop()
	var plain, with []*drainRun
	var ratios []float64
	var refreshes int64
	for i := range cfg.Rounds {
		order := []bool{i%2 == 1, i%2 == 0} // without the console first in even rounds
		for _, withConsole := range order {
			if err := s.fill(ctx, n); err != nil {
				return nil, err
			}
			stop := func() (int64, error) { return 0, nil }
			if withConsole {
				stop = site.refresh(ctx, ConsoleRefresh)
			}
			d, err := s.drainRelay(ctx, cfg, SourcePoll, n, false, s.noneUnpublished)
			got, rerr := stop()
			if err = errors.Join(err, rerr); err != nil {
				return nil, err
			}
			if withConsole {
				refreshes += got
				with = append(with, d)
			} else {
				plain = append(plain, d)
			}
			fmt.Fprintf(cfg.Progress, "console: drain pair %d, console %v: %.0f events/s\n", i+1, withConsole, float64(n)/d.elapsed.Seconds())
		}
		ratios = append(ratios, with[i].elapsed.Seconds()/plain[i].elapsed.Seconds())
	}
	mk := func(c, desc string, runs []*drainRun) Result {
		m := medianRun(runs)
		return Result{Scenario: "console", Case: c, Description: desc, Workers: 1, Unit: "event", Ops: int64(n), Seconds: m.elapsed.Seconds(),
			PerSecond: float64(n) / m.elapsed.Seconds(), RoundsPerSecond: perSecond(runs, n), Env: s.env,
			Console: &ConsoleFigures{Route: c, Kind: "drain"}}
	}
	base := mk("drain", fmt.Sprintf("one relay draining %d events to %s, no console", n, s.broker.Describe()), plain)
	wc := mk("drain_with_console", fmt.Sprintf("the same with a console whose overview is refreshed every %s (and which samples every %s)", ConsoleRefresh, console.SampleEvery), with)
	wc.Console.DrainRatio, wc.Console.PairRatios, wc.Console.Refreshes = median(ratios), ratios, refreshes
	wc.VsBaseline = &Comparison{Case: "drain", Ratio: 1 / median(ratios), RoundRatios: invert(ratios)}
	return []Result{base, wc}, nil
}

func invert(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = 1 / x
	}
	return out
}

// refresh requests the overview as an open overview page does (the API
// call its script makes) every interval, and records a sample every
// console.SampleEvery as `outbox console` does, until the returned stop
// is called; stop returns how many refreshes were answered.
func (c *consoleSite) refresh(ctx context.Context, every time.Duration) func() (int64, error) {
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var n int64
	var ferr error
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if _, _, err := c.get(rctx, "/api/v1/overview", false); err != nil {
				if rctx.Err() == nil {
					ferr = err
				}
				return
			}
			n++
			select {
			case <-rctx.Done():
				return
			case <-t.C:
			}
		}
	})
	wg.Go(func() { c.srv.Sample(rctx) })
	return func() (int64, error) {
		cancel()
		wg.Wait()
		return n, ferr
	}
}

// writeConsoleTable prints the console scenario's results.
func writeConsoleTable(w io.Writer, results []Result) error {
	var b strings.Builder
	first := results[0]
	if e := first.Env; e != nil {
		fmt.Fprintf(&b, "scenario console: every GET route of the console, %d requests each (after 3 unmeasured), one at a time, over HTTP on the loopback\n", ConsoleTimed)
		if first.Console != nil && first.Console.Seeded != "" {
			fmt.Fprintf(&b, "table: %s\n", first.Console.Seeded)
		}
		fmt.Fprintf(&b, "PostgreSQL %s at %s: %s\n", e.ServerVersion, e.Host, e.SettingsLine())
		if e.SchemaVersion > 0 {
			fmt.Fprintf(&b, "outbox schema version %d\n", e.SchemaVersion)
		}
		clientLine(&b, e, "measurement")
		b.WriteString("\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route                                \tkind\tp50 ms\tp95 ms\tmax ms\tbytes\t")
	var drains []Result
	for _, r := range results {
		f := r.Console
		if f == nil {
			continue
		}
		if f.Kind == "drain" {
			drains = append(drains, r)
			continue
		}
		fmt.Fprintf(tw, "%-37s\t%s\t%s\t%s\t%s\t%d\t\n", r.Case, f.Kind, fmtMs(r.Latency.P50), fmtMs(f.P95), fmtMs(r.Latency.Max), f.Bytes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(drains) > 0 {
		b.Reset()
		b.WriteString("\n")
		for _, r := range drains {
			rounds := make([]string, len(r.RoundsPerSecond))
			for i, v := range r.RoundsPerSecond {
				rounds[i] = fmt.Sprintf("%.0f", v)
			}
			fmt.Fprintf(&b, "%-19s %7.0f events/s (median drain; each: %s)  %s\n", r.Case, r.PerSecond, strings.Join(rounds, "/"), r.Description)
			if f := r.Console; f.DrainRatio > 0 {
				pairs := make([]string, len(f.PairRatios))
				for i, v := range f.PairRatios {
					pairs[i] = fmt.Sprintf("%.3f", v)
				}
				fmt.Fprintf(&b, "drain time with the console over without: %.3f (median of %d pairs: %s; geometric mean %.3f); %d overview refreshes answered\n",
					f.DrainRatio, len(pairs), strings.Join(pairs, " "), geoMean(f.PairRatios), f.Refreshes)
			}
		}
		if _, err := io.WriteString(w, b.String()); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, "\n  p50/p95/max: time to the last byte of the answer, as the client saw it; bytes: mean size of an answer;\n"+
		"  kind: page (HTML, signed in through the form), api (Bearer token), background (the console's sampler)\n")
	return err
}
