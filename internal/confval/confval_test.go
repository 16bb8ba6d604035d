package confval

import (
	"context"
	"errors"
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
	var buf strings.Builder
	given := slog.New(slog.NewTextHandler(&buf, nil))
	Logger(given).Warn("kept")
	if !strings.Contains(buf.String(), "kept") {
		t.Fatal("a logger the Config gives is not the one written to")
	}
	if once := Logger(given); Logger(once) != once {
		t.Fatal("a logger Logger returned is wrapped again")
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

// A record whose message or values hold line breaks reaches the handler
// without them, however deep in a group, as a value or an error.
func TestOneLine(t *testing.T) {
	var got slog.Record
	var attrs []slog.Attr
	h := recordHandler(func(r slog.Record) {
		got = r
		r.Attrs(func(a slog.Attr) bool { attrs = append(attrs, a); return true })
	})
	l := OneLine(slog.New(h)).With("with", "a\nb")
	l.Error("line\none", "err", errors.New("pq: x\nDETAIL: y"), slog.Group("g", "s", "c\r\nd"), "n", 3)
	if strings.ContainsAny(got.Message, "\r\n") {
		t.Errorf("message %q", got.Message)
	}
	var all strings.Builder
	for _, a := range attrs {
		all.WriteString(a.String())
	}
	for _, a := range h.with {
		all.WriteString(a.String())
	}
	if s := all.String(); strings.ContainsAny(s, "\r\n") || !strings.Contains(s, "pq: x; DETAIL: y") || !strings.Contains(s, "n=3") {
		t.Errorf("attributes %q", s)
	}
}

type recordFunc struct {
	f    func(slog.Record)
	with []slog.Attr
}

func recordHandler(f func(slog.Record)) *recordFunc { return &recordFunc{f: f} }

func (h *recordFunc) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordFunc) Handle(_ context.Context, r slog.Record) error {
	h.f(r)
	return nil
}
func (h *recordFunc) WithAttrs(as []slog.Attr) slog.Handler { h.with = append(h.with, as...); return h }
func (h *recordFunc) WithGroup(string) slog.Handler         { return h }
