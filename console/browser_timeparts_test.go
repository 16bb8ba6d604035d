package console_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// A table partitioned by time: the overview says how it is partitioned
// and names a partition kept past the window for its unpublished event,
// in the browser and in the API.
func TestBrowserShowsTimePartitions(t *testing.T) {
	t.Parallel()
	r := newRig(t, &rigOptions{users: true, migrate: &outboxdriver.MigrateOptions{TimePartitions: outboxdriver.TimePartitionsDay}})
	lo := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -10)
	kept := r.tb.Name + "_p" + lo.Format("20060102")
	if _, err := r.pool.Exec(r.ctx, `CREATE TABLE `+outboxdriver.QuoteIdent(r.tb.Schema)+`.`+outboxdriver.QuoteIdent(kept)+` PARTITION OF `+r.tb.Qualified("")+
		` FOR VALUES FROM ('`+lo.Format(time.RFC3339)+`') TO ('`+lo.AddDate(0, 0, 1).Format(time.RFC3339)+`')`); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(r.ctx, `INSERT INTO `+r.tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, created_at)
VALUES (gen_random_uuid(), 'order', '1', 'Placed', '{}', $1)`, lo.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.st.MaintainTimePartitions(r.ctx, r.tb, outboxdriver.TimePartitionMaintenance{KeepFor: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}

	c := newChrome(t, r)
	c.do("viewer signs in", c.signIn(r.users[ops.Viewer]), c.shot("overview-time-partitions.png"))
	text := c.eval("time partitions", `document.querySelector("#time-partitions").textContent + " | " + document.querySelector("#partitions-kept").textContent`)
	for _, want := range []string{" by day from " + lo.Format("2006-01-02"), "7 ahead", "last maintained", "0 rows in the default partition", kept + " (1)"} {
		if !strings.Contains(text, want) {
			t.Errorf("the overview says %q; want it to contain %q", text, want)
		}
	}

	code, body := r.api("GET", "/api/v1/overview", r.users[ops.Viewer].token, nil)
	var ov struct {
		TimePartitions *outboxdriver.TimePartitionStatus `json:"time_partitions"`
	}
	if code != 200 || json.Unmarshal(body, &ov) != nil || ov.TimePartitions == nil || ov.TimePartitions.Unit != "day" ||
		len(ov.TimePartitions.Kept) != 1 || ov.TimePartitions.Kept[0].Partition != kept {
		t.Fatalf("overview API: %d %s", code, body)
	}
}
