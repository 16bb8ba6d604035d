package confval

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestPositiveOr(t *testing.T) {
	var n int
	if err := PositiveOr("p", "N", &n, 7); err != nil || n != 7 {
		t.Fatalf("zero: %d, %v", n, err)
	}
	d := 3 * time.Second
	if err := PositiveOr("p", "D", &d, time.Minute); err != nil || d != 3*time.Second {
		t.Fatalf("positive kept: %v, %v", d, err)
	}
	n = -1
	err := PositiveOr("p", "N", &n, 7)
	if err == nil || err.Error() != "p: invalid Config.N -1: must be positive (or 0 for the default 7)" {
		t.Fatalf("negative: %v", err)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@h:5432/db": "postgres://u:xxxxx@h:5432/db",
		"mysql://root@h:3306/test":      "mysql://root@h:3306/test",
		"sqlite:///var/lib/app.db":      "sqlite:///var/lib/app.db",
		"postgres://u:secret@%zz/x":     "(unparsable)",
	} {
		if got := RedactURL(in); got != want || strings.Contains(got, "secret") {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLogger(t *testing.T) {
	given := slog.New(slog.DiscardHandler)
	if got := Logger(given); got != given {
		t.Fatal("a logger the Config gives is not kept")
	}
	l := Logger(nil)
	if l == nil || l == slog.Default() {
		t.Fatalf("Logger(nil) = %v, want a logger of its own", l)
	}
	ctx := context.Background()
	if l.Enabled(ctx, slog.LevelInfo) || !l.Enabled(ctx, slog.LevelWarn) {
		t.Fatal("the default logger must take warnings and errors, not info")
	}
}
