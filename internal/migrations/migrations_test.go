package migrations_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/outboxdriver"
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

func TestLoadSortsByVersionAndPairsFiles(t *testing.T) {
	fsys := fstest.MapFS{
		"m/010_ten.up.sql":     file("up 10"),
		"m/010_ten.down.sql":   file("down 10"),
		"m/002_two.down.sql":   file("down 2"),
		"m/002_two.up.sql":     file("up 2"),
		"m/001_first.up.sql":   file("up 1"),
		"m/001_first.down.sql": file("down 1"),
		"other/003_x.up.sql":   file("not read"),
	}
	got, err := migrations.Load(fsys, "m")
	if err != nil {
		t.Fatal(err)
	}
	want := []migrations.Migration{
		{Version: 1, Name: "first", Up: "up 1", Down: "down 1"},
		{Version: 2, Name: "two", Up: "up 2", Down: "down 2"},
		{Version: 10, Name: "ten", Up: "up 10", Down: "down 10"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Load = %+v, want %+v", got, want)
	}
	if v := migrations.Latest(got); v != 10 {
		t.Fatalf("Latest = %d, want 10", v)
	}
}

func TestLoadAllowsAMissingDownFile(t *testing.T) {
	got, err := migrations.Load(fstest.MapFS{"m/001_only_up.up.sql": file("up")}, "m")
	if err != nil {
		t.Fatal(err)
	}
	want := []migrations.Migration{{Version: 1, Name: "only_up", Up: "up"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Load = %+v, want %+v", got, want)
	}
}

func TestLoadRefusesBadFiles(t *testing.T) {
	cases := map[string]struct {
		fsys fstest.MapFS
		want string
	}{
		"no number":         {fstest.MapFS{"m/init.up.sql": file("")}, "bad migration file name init.up.sql"},
		"number not digits": {fstest.MapFS{"m/one_init.up.sql": file("")}, "bad migration file name one_init.up.sql"},
		"negative":          {fstest.MapFS{"m/-1_init.up.sql": file("")}, "bad migration file name -1_init.up.sql"},
		"no direction":      {fstest.MapFS{"m/001_init.sql": file("")}, "bad migration file name 001_init.sql"},
		"other extension":   {fstest.MapFS{"m/001_init.up.txt": file("")}, "bad migration file name 001_init.up.txt"},
		"two up files": {fstest.MapFS{
			"m/001_a.up.sql": file(""),
			"m/01_b.up.sql":  file(""),
		}, "version 1 is there twice"},
		"two down files": {fstest.MapFS{
			"m/001_a.up.sql":   file(""),
			"m/001_a.down.sql": file(""),
			"m/1_a.down.sql":   file(""),
		}, "version 1 is there twice"},
		"down without up": {fstest.MapFS{"m/002_b.down.sql": file("")}, "migration 2 has a down file but no up file"},
		"missing dir":     {fstest.MapFS{"x/001_a.up.sql": file("")}, "m"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ms, err := migrations.Load(c.fsys, "m")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Load = %+v, %v; want an error containing %q", ms, err, c.want)
			}
		})
	}
}

func TestMustLoadPanicsOnABadFile(t *testing.T) {
	defer func() {
		r := recover()
		if s, _ := r.(string); !strings.Contains(s, "bad migration file name x.up.sql") {
			t.Fatalf("recovered %v, want a panic naming the bad file", r)
		}
	}()
	migrations.MustLoad(fstest.MapFS{"m/x.up.sql": file("")}, "m")
	t.Fatal("MustLoad did not panic")
}

var three = []migrations.Migration{{Version: 1, Name: "a"}, {Version: 2, Name: "b"}, {Version: 3, Name: "c"}}

func TestUpAppliesThePendingOnesOldestFirst(t *testing.T) {
	var seen []string
	ran, err := migrations.Up(three, map[int]bool{2: true}, func(m migrations.Migration) error {
		seen = append(seen, m.Name)
		return nil
	})
	if err != nil || !reflect.DeepEqual(ran, []int{1, 3}) || !reflect.DeepEqual(seen, []string{"a", "c"}) {
		t.Fatalf("Up = %v, %v (applied %v); want [1 3] in that order", ran, err, seen)
	}
}

func TestUpStopsAtTheFirstFailure(t *testing.T) {
	boom := errors.New("boom")
	ran, err := migrations.Up(three, nil, func(m migrations.Migration) error {
		if m.Version == 2 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || !reflect.DeepEqual(ran, []int{1}) {
		t.Fatalf("Up = %v, %v; want [1], boom", ran, err)
	}
}

func TestDownRevertsTheAppliedOnesNewestFirst(t *testing.T) {
	done := map[int]bool{1: true, 2: true, 3: true}
	ran, err := migrations.Down(three, done, 1, func(migrations.Migration) error { return nil })
	if err != nil || !reflect.DeepEqual(ran, []int{3, 2}) {
		t.Fatalf("Down to 1 = %v, %v; want [3 2]", ran, err)
	}
	ran, err = migrations.Down(three, map[int]bool{1: true, 3: true}, 0, func(migrations.Migration) error { return nil })
	if err != nil || !reflect.DeepEqual(ran, []int{3, 1}) {
		t.Fatalf("Down to 0 = %v, %v; want [3 1]", ran, err)
	}
	boom := errors.New("boom")
	ran, err = migrations.Down(three, done, 0, func(m migrations.Migration) error {
		if m.Version == 1 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || !reflect.DeepEqual(ran, []int{3, 2}) {
		t.Fatalf("failing Down = %v, %v; want [3 2], boom", ran, err)
	}
}

func TestStatementsSplitsAtLineEndSemicolons(t *testing.T) {
	got := migrations.Statements(`-- a comment
CREATE TABLE a (
    x INT -- inline; not an end
);

  -- another comment
INSERT INTO a VALUES ('x;y');
SELECT 1`)
	want := []string{
		"CREATE TABLE a (\n    x INT -- inline; not an end\n)",
		"INSERT INTO a VALUES ('x;y')",
		"SELECT 1",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Statements = %q, want %q", got, want)
	}
}

func TestStatementsKeepsCompoundStatementsWhole(t *testing.T) {
	got := migrations.Statements(`DROP PROCEDURE IF EXISTS p;
CREATE PROCEDURE p()
BEGIN
    DECLARE n INT DEFAULT 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    begin
        ROLLBACK;
        RESIGNAL;
    END;
    IF n = 0 THEN SET n = 1; END IF;
    SELECT n;
END;
SELECT 2;`)
	want := []string{
		"DROP PROCEDURE IF EXISTS p",
		"CREATE PROCEDURE p()\nBEGIN\n    DECLARE n INT DEFAULT 0;\n    DECLARE EXIT HANDLER FOR SQLEXCEPTION\n    begin\n        ROLLBACK;\n        RESIGNAL;\n    END;\n    IF n = 0 THEN SET n = 1; END IF;\n    SELECT n;\nEND",
		"SELECT 2",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Statements = %q, want %q", got, want)
	}
}

// An up file's "-- relays: from N" line sets the oldest relay that works
// with the table once it ran; a bad line is refused when loading.
func TestRelaysFromLine(t *testing.T) {
	fsys := fstest.MapFS{
		"m/001_a.up.sql": file("CREATE TABLE a ();"),
		"m/002_b.up.sql": file("-- relays: from 2\n-- why\nALTER TABLE a ADD b int;"),
		"m/003_c.up.sql": file("ALTER TABLE a ADD c int;"),
	}
	ms, err := migrations.Load(fsys, "m")
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].RelaysFrom != 0 || ms[1].RelaysFrom != 2 || ms[2].RelaysFrom != 0 {
		t.Fatalf("RelaysFrom = %d %d %d; want 0 2 0", ms[0].RelaysFrom, ms[1].RelaysFrom, ms[2].RelaysFrom)
	}
	if got := migrations.RelaysFrom(ms, map[int]bool{1: true}); got != 0 {
		t.Fatalf("RelaysFrom at version 1 = %d; want 0", got)
	}
	if got := migrations.RelaysFrom(ms, map[int]bool{1: true, 2: true, 3: true}); got != 2 {
		t.Fatalf("RelaysFrom at version 3 = %d; want 2", got)
	}
	for name, body := range map[string]string{
		"above its own version": "-- relays: from 3\n",
		"not a number":          "-- relays: from two\n",
		"zero":                  "-- relays: from 0\n",
		"twice":                 "-- relays: from 1\n-- relays: from 2\n",
	} {
		bad := fstest.MapFS{"m/002_b.up.sql": file(body)}
		if _, err := migrations.Load(bad, "m"); err == nil || !strings.Contains(err.Error(), "migration 2") {
			t.Errorf("%s: Load = %v; want an error about migration 2", name, err)
		}
	}
}

// Behind names the pending migrations a live relay is too old for, and
// those relays; a relay of unknown version (0) is older than every one.
func TestBehind(t *testing.T) {
	ms := []migrations.Migration{{Version: 1, Name: "a"}, {Version: 2, Name: "b", RelaysFrom: 2}, {Version: 3, Name: "c"}}
	done := map[int]bool{1: true}
	if err := migrations.Behind(ms, done, []migrations.Relay{{Name: "new", SchemaVersion: 2}}); err != nil {
		t.Fatalf("Behind with a relay at 2 = %v; want nil", err)
	}
	err := migrations.Behind(ms, done, []migrations.Relay{{Name: "new", SchemaVersion: 3}, {Name: "old"}, {Name: "one", SchemaVersion: 1}})
	var behind *outboxdriver.RelaysBehindError
	if !errors.As(err, &behind) || len(behind.Migrations) != 1 || behind.Migrations[0].Version != 2 ||
		len(behind.Relays) != 2 || behind.Relays[0].Name != "old" || behind.Relays[1].Name != "one" {
		t.Fatalf("Behind = %v (%+v); want migration 2 held up by old and one", err, behind)
	}
	if err := migrations.Behind(ms, map[int]bool{1: true, 2: true}, []migrations.Relay{{Name: "old"}}); err != nil {
		t.Fatalf("Behind with the floor applied already = %v; want nil: only pending migrations count", err)
	}
}

// Versions need not be contiguous: Up applies every version not applied
// yet, whatever the highest one applied is: 21 and 22 above a gap, and 20
// once it arrives below them.
func TestUpAppliesVersionsAcrossAGap(t *testing.T) {
	apply := func(ms []migrations.Migration, done map[int]bool) []int {
		t.Helper()
		ran, err := migrations.Up(ms, done, func(m migrations.Migration) error { done[m.Version] = true; return nil })
		if err != nil {
			t.Fatal(err)
		}
		return ran
	}
	done := map[int]bool{19: true}
	gap := []migrations.Migration{{Version: 19}, {Version: 21}, {Version: 22}}
	if ran := apply(gap, done); !reflect.DeepEqual(ran, []int{21, 22}) {
		t.Fatalf("Up above a gap ran %v; want [21 22]", ran)
	}
	filled := []migrations.Migration{{Version: 19}, {Version: 20}, {Version: 21}, {Version: 22}}
	if ran := apply(filled, done); !reflect.DeepEqual(ran, []int{20}) {
		t.Fatalf("Up once the gap is filled ran %v; want [20]", ran)
	}
}
