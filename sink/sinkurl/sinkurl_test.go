package sinkurl_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/sink/sinkurl"
)

// A URL the package cannot open gets a clear error that names the forms
// it can, and never shows a password.
func TestOpenRefusesWhatItCannotOpen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct{ url, want string }{
		{"ftp://user:hunter2@x", `unknown scheme "ftp"`},
		{"no-scheme", "has no scheme"},
		{"stdout://somewhere", "the stdout sink takes no address"},
		{"https://example.com/hook", "no signing secret"},
	} {
		_, err := sinkurl.Open(ctx, c.url, nil, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("Open(%q) = %v, want an error saying %q", c.url, err, c.want)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("Open(%q) = %v: the error shows the password", c.url, err)
		}
		if !strings.Contains(err.Error(), "nats://") && strings.Contains(c.want, "scheme") {
			t.Fatalf("Open(%q) = %v: the error does not list the forms (%s)", c.url, err, sinkurl.Schemes)
		}
	}
}

// stdout: opens the sink that prints each event.
func TestOpenStdout(t *testing.T) {
	s, err := sinkurl.Open(context.Background(), "stdout:", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
