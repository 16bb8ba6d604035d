package webhookconsumer

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink/webhooksink"
)

// DefaultMaxBodyBytes is the largest request body read by default.
const DefaultMaxBodyBytes = 16 << 20

// Config configures a Handler. Secrets is required.
type Config struct {
	// Secrets are the signing secrets, as webhooksink's Config.Secrets
	// ("whsec_<base64>", the prefix optional). A request signed with any
	// of them is accepted: list the new and the old during a rotation.
	// Required.
	Secrets []string
	// Tolerance is the largest difference between a request's
	// webhook-timestamp and the receiver's clock that is accepted; older
	// requests are refused as replays. Default webhooksink.DefaultTolerance
	// (5 minutes).
	Tolerance time.Duration
	// MaxBodyBytes is the largest body read; larger requests are refused
	// with 413. Default 16 MiB.
	MaxBodyBytes int64
	// Destination names the destination of a request (kept with a dead
	// letter; outbox.event.<type> gives the aggregate type). Default: the
	// last segment of the request path, unescaped.
	Destination func(r *http.Request) string
	// Logger receives refused requests, failures and dead letters. Default:
	// warnings and errors as text on standard error. Payloads and
	// signatures are never logged.
	Logger *slog.Logger
}

// Handler receives webhooks and handles them through an inbox.
type Handler[TTx any] struct {
	ib  *inbox.Inbox[TTx]
	h   consumer.Handler[TTx]
	cfg Config
	log *slog.Logger
}

// New returns a Handler that verifies requests with cfg.Secrets and handles
// their events with h through ib. It does no I/O.
func New[TTx any](ib *inbox.Inbox[TTx], h consumer.Handler[TTx], cfg *Config) (*Handler[TTx], error) {
	if ib == nil {
		return nil, errors.New("webhookconsumer: inbox is nil")
	}
	if h == nil {
		return nil, errors.New("webhookconsumer: handler is nil")
	}
	if cfg == nil || len(cfg.Secrets) == 0 {
		return nil, errors.New("webhookconsumer: no Config.Secrets: give the secrets the sender signs with")
	}
	c := *cfg
	c.Secrets = append([]string(nil), cfg.Secrets...)
	// Verify checks the secrets before anything else: with no headers, a
	// valid set of secrets gives ErrMissingHeaders.
	if err := webhooksink.Verify(c.Secrets, http.Header{}, nil, 0, time.Time{}); !errors.Is(err, webhooksink.ErrMissingHeaders) {
		return nil, fmt.Errorf("webhookconsumer: Config.Secrets: %w", err)
	}
	if err := confval.PositiveOr("webhookconsumer", "Tolerance", &c.Tolerance, webhooksink.DefaultTolerance); err != nil {
		return nil, err
	}
	if err := confval.PositiveOr("webhookconsumer", "MaxBodyBytes", &c.MaxBodyBytes, DefaultMaxBodyBytes); err != nil {
		return nil, err
	}
	if c.Destination == nil {
		c.Destination = lastSegment
	}
	c.Logger = confval.Logger(c.Logger)
	return &Handler[TTx]{ib: ib, h: h, cfg: c, log: c.Logger.With("consumer", ib.Consumer())}, nil
}

// lastSegment is the last segment of the request path, unescaped.
func lastSegment(r *http.Request) string {
	p := r.URL.EscapedPath()
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		p = p[i+1:]
	}
	if s, err := url.PathUnescape(p); err == nil {
		return s
	}
	return p
}

// ServeHTTP verifies the request, handles its event and answers: see the
// package documentation.
func (h *Handler[TTx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "webhooks are POSTed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("the body is larger than %d bytes", h.cfg.MaxBodyBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading the body failed", http.StatusBadRequest)
		return
	}
	if err := webhooksink.Verify(h.cfg.Secrets, r.Header, body, h.cfg.Tolerance, time.Time{}); err != nil {
		h.refuse(w, r, err)
		return
	}
	msg := h.message(r, body)
	ctx := r.Context()
	if err := h.handle(ctx, msg); err != nil {
		if !consumer.IsPermanent(err) {
			h.log.Warn("webhookconsumer: handling failed; answering 500 so that the sender retries", "event_id", msg.EventID, "err", err)
			http.Error(w, "the event was not handled; send it again", http.StatusInternalServerError)
			return
		}
		if dlErr := h.ib.DeadLetter(context.WithoutCancel(ctx), msg, err); dlErr != nil {
			h.log.Error("webhookconsumer: cannot record a dead letter; answering 500 so that the sender retries", "event_id", msg.EventID, "cause", err, "err", dlErr)
			http.Error(w, "the event was not handled; send it again", http.StatusInternalServerError)
			return
		}
		h.log.Warn("webhookconsumer: event dead-lettered", "event_id", msg.EventID, "err", err)
		http.Error(w, "the event can never be handled; it is recorded in the receiver's dead letters", http.StatusUnprocessableEntity)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refuse answers a request that failed verification.
func (h *Handler[TTx]) refuse(w http.ResponseWriter, r *http.Request, err error) {
	code, text := http.StatusUnauthorized, "no valid webhook-signature"
	switch {
	case errors.Is(err, webhooksink.ErrMissingHeaders):
		code, text = http.StatusBadRequest, "missing webhook-id, webhook-timestamp or webhook-signature header"
	case errors.Is(err, webhooksink.ErrTimestamp):
		code, text = http.StatusBadRequest, fmt.Sprintf("webhook-timestamp is invalid or more than %v away from the receiver's clock: refused as a replay (check the sender's clock)", h.cfg.Tolerance)
	}
	h.log.Warn("webhookconsumer: request refused", "status", code, "remote", r.RemoteAddr, "err", err)
	http.Error(w, text, code)
}

// handle runs one attempt; a panicking handler fails it (the transaction
// rolls back) instead of the server.
func (h *Handler[TTx]) handle(ctx context.Context, msg inbox.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
			h.log.Error("webhookconsumer: handler panicked", "event_id", msg.EventID, "panic", p, "stack", string(debug.Stack()))
		}
	}()
	_, err = h.ib.Handle(ctx, msg, func(ctx context.Context, tx TTx) error { return h.h(ctx, tx, msg) })
	return err
}

// message builds the inbox message of a verified request.
func (h *Handler[TTx]) message(r *http.Request, body []byte) inbox.Message {
	hdr := make(map[string]string, len(r.Header))
	for k, vs := range r.Header {
		if len(vs) > 0 {
			hdr[strings.ToLower(k)] = vs[0]
		}
	}
	if _, ok := hdr[inbox.HeaderID]; !ok {
		hdr[inbox.HeaderID] = hdr[webhooksink.HeaderID]
	}
	var key []byte
	if v := r.Header.Get(webhooksink.KeyHeader); v != "" {
		key = []byte(v)
	} else if v := r.Header.Get(webhooksink.KeyBase64Header); v != "" {
		key, _ = base64.StdEncoding.DecodeString(v)
	}
	msg := inbox.NewMessage(h.cfg.Destination(r), key, hdr, body)
	msg.System = "webhook"
	return msg
}
