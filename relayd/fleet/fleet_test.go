package fleet_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/relayd/fleet"
)

// A fleet's sources are checked as relay.New checks its Config, before
// anything is opened: the error names the source and the field.
func TestCheckSourcesChecksEachRelayConfig(t *testing.T) {
	t.Parallel()
	ok := fleet.Source{Name: "a", DB: "postgres://db-a", Sink: "stdout:"}
	bad := fleet.Source{Name: "b", DB: "postgres://db-b", Sink: "stdout:", Options: relayd.Options{Relay: relay.Config{LeaseTTL: time.Millisecond}}}
	if err := fleet.CheckSources([]fleet.Source{ok}); err != nil {
		t.Fatalf("CheckSources with the relay's defaults: %v", err)
	}
	err := fleet.CheckSources([]fleet.Source{ok, bad})
	var ce *relay.ConfigError
	if !errors.As(err, &ce) || ce.Field != "LeaseTTL" || !strings.HasPrefix(err.Error(), `source "b": `) {
		t.Fatalf("CheckSources: %v, want source \"b\" named and a *relay.ConfigError for LeaseTTL", err)
	}
}
