package confval

import (
	"context"
	"log/slog"
	"strings"
)

// OneLine returns a logger whose records hold no line break: in the
// message and in every string or error value (a driver's error with a
// DETAIL line, a broker's multi-line refusal), CR and LF become "; ".
// Whatever handler l writes to, one record stays one line that a log
// search finds whole. A logger OneLine made is returned as it is.
func OneLine(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(oneLine); ok {
		return l
	}
	return slog.New(oneLine{l.Handler()})
}

type oneLine struct{ h slog.Handler }

var breaks = strings.NewReplacer("\r\n", "; ", "\n", "; ", "\r", "; ")

func flat(s string) string {
	if strings.ContainsAny(s, "\r\n") {
		return breaks.Replace(s)
	}
	return s
}

func flatAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if s := v.String(); strings.ContainsAny(s, "\r\n") {
			return slog.String(a.Key, flat(s))
		}
	case slog.KindAny:
		if err, ok := v.Any().(error); ok && err != nil {
			return slog.String(a.Key, flat(err.Error()))
		}
	case slog.KindGroup:
		as := v.Group()
		out := make([]any, len(as))
		for i, g := range as {
			out[i] = flatAttr(g)
		}
		return slog.Group(a.Key, out...)
	}
	return slog.Attr{Key: a.Key, Value: v}
}

func (o oneLine) Enabled(ctx context.Context, l slog.Level) bool { return o.h.Enabled(ctx, l) }

func (o oneLine) Handle(ctx context.Context, r slog.Record) error {
	n := slog.NewRecord(r.Time, r.Level, flat(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		n.AddAttrs(flatAttr(a))
		return true
	})
	return o.h.Handle(ctx, n)
}

func (o oneLine) WithAttrs(as []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = flatAttr(a)
	}
	return oneLine{o.h.WithAttrs(out)}
}

func (o oneLine) WithGroup(name string) slog.Handler { return oneLine{o.h.WithGroup(name)} }
