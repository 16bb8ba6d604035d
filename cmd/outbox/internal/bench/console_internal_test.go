package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
)

// The console scenario times every GET route the console answers: its
// pages and the GET operations of its OpenAPI document, found on a real
// console. A route without requests to time is an error naming it.
func TestConsoleScenarioCoversEveryRoute(t *testing.T) {
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	ctx := testenv.Context(t, time.Minute)
	if _, err := outboxpgx.New(pool).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	site, err := startConsole(ctx, pool, tb)
	if err != nil {
		t.Fatal(err)
	}
	defer site.stop()
	variants := consoleVariants(fixtures{})
	routes, err := consoleRoutes(ctx, site, variants)
	if err != nil {
		t.Fatal(err)
	}
	var pages, api int
	for _, r := range routes {
		if r.api {
			api++
		} else {
			pages++
		}
	}
	if pages < 10 || api < 10 || len(routes) != len(variants) {
		t.Fatalf("%d pages and %d API routes of %d with requests; want every one", pages, api, len(variants))
	}
	delete(variants, "GET /held")
	if _, err := consoleRoutes(ctx, site, variants); err == nil || !strings.Contains(err.Error(), "GET /held") {
		t.Fatalf("a route without requests: %v; want an error naming it", err)
	}
}
