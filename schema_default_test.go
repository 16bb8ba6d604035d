package outbox_test

import (
	"context"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// writerIn is a Writer whose database has its own default schema.
type writerIn string

func (w writerIn) InsertTx(context.Context, struct{}, outboxdriver.Table, []outboxdriver.Row) error {
	return nil
}
func (w writerIn) DefaultSchema() string { return string(w) }

func TestNewTakesTheDriversDefaultSchema(t *testing.T) {
	for _, c := range []struct {
		drv    writerIn
		schema string
		want   outboxdriver.Table
	}{
		{"main", "", outboxdriver.Table{Schema: "main", Name: "outbox"}},
		{"", "", outboxdriver.Table{Schema: "", Name: "outbox"}}, // the connection's own
		{"main", "app", outboxdriver.Table{Schema: "app", Name: "outbox"}},
	} {
		ob, err := outbox.New[struct{}](c.drv, &outbox.Config{Schema: c.schema})
		if err != nil {
			t.Fatal(err)
		}
		if got := ob.Table(); got != c.want {
			t.Errorf("driver default %q, schema %q: table %+v, want %+v", c.drv, c.schema, got, c.want)
		}
	}
	if _, err := outbox.New[struct{}](writerIn(""), &outbox.Config{Table: `x"; DROP TABLE y`}); err == nil {
		t.Fatal("hostile table name accepted with the connection's schema")
	}
}
