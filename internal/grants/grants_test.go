package grants

import (
	"strings"
	"testing"
)

// Role names are identifiers (on MySQL/MariaDB with an optional @host),
// at least one job is named, and no role takes two jobs.
func TestRolesAreValidated(t *testing.T) {
	for _, c := range []struct {
		r     Roles
		mysql bool
		want  string
	}{
		{Roles{}, false, "name at least one role"},
		{Roles{Owner: "o"}, false, "name at least one role"},
		{Roles{Writer: `w"; DROP TABLE x; --`}, false, "a role name must be"},
		{Roles{Writer: "w", Relay: "w"}, false, "--writer and --relay both name w"},
		{Roles{Console: "c", Owner: "c"}, false, "--console and --owner both name c"},
		{Roles{Writer: "w@host"}, false, "no @host"},
		{Roles{Writer: "w@h'ost"}, true, "the host after @"},
		{Roles{Writer: "1w"}, true, "a role name must be"},
		{Roles{Writer: strings.Repeat("w", 64)}, false, "a role name must be"},
	} {
		err := c.r.validate(c.mysql)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v (mysql %v): %v; want %q", c.r, c.mysql, err, c.want)
		}
	}
	for _, ok := range []struct {
		r     Roles
		mysql bool
	}{
		{Roles{Writer: "app_writer", Relay: "app_relay", Console: "App_Console", Owner: "app_owner"}, false},
		{Roles{Writer: "w@%", Relay: "r@10.0.0.%", Console: "c@localhost"}, true},
		{Roles{Relay: "r"}, true},
	} {
		if err := ok.r.validate(ok.mysql); err != nil {
			t.Errorf("%+v (mysql %v): %v", ok.r, ok.mysql, err)
		}
	}
}

// A plan prints as a script: header and notes as comments, statements
// ended by semicolons, in a transaction where the database has one.
func TestPlanText(t *testing.T) {
	p := Plan{Header: []string{"h"}, Statements: []string{"GRANT a", "GRANT b"}, InTx: true, Notes: []string{"n"}}
	want := "-- h\nBEGIN;\nGRANT a;\nGRANT b;\nCOMMIT;\n\n-- n\n"
	if got := p.Text(); got != want {
		t.Errorf("Text = %q, want %q", got, want)
	}
	p.InTx = false
	if got := p.Text(); strings.Contains(got, "BEGIN") {
		t.Errorf("Text without a transaction = %q", got)
	}
}
