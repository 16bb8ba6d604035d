package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/amqpsink"
	"github.com/outboxkit/outbox/sink/kafkasink"
	"github.com/outboxkit/outbox/sink/mqttsink"
	"github.com/outboxkit/outbox/sink/natssink"
	"github.com/outboxkit/outbox/sink/redissink"
	"github.com/outboxkit/outbox/sink/stdoutsink"
	"github.com/outboxkit/outbox/sink/webhooksink"
)

// sinkFlags are the broker-specific options of `outbox relay`.
type sinkFlags struct {
	url            string
	natsStream     string
	natsSubjects   []string
	natsNoCreate   bool
	amqpExchange   string
	amqpDeclare    bool
	redisMaxLen    int64
	mqttQoS        int
	webhookSecrets []string
	webhookPrivate bool
	webhookTimeout time.Duration
}

const sinkSchemes = "nats://host:port, kafka://host:port[,host:port], amqp://user:pass@host:port/vhost, redis://host:port/db, mqtt://host:port, https://host/path/${destination} or stdout:"

// openSink connects to the broker named by --sink (or OUTBOX_SINK).
func (f *sinkFlags) open(ctx context.Context, log *slog.Logger) (sink.Sink, error) {
	raw := f.url
	if raw == "" {
		raw = os.Getenv("OUTBOX_SINK")
	}
	if raw == "" {
		return nil, fmt.Errorf("no sink: pass --sink %s, or set OUTBOX_SINK", sinkSchemes)
	}
	scheme, _, ok := strings.Cut(raw, ":")
	if !ok {
		return nil, fmt.Errorf("--sink %q has no scheme: use %s", redact(raw), sinkSchemes)
	}
	switch strings.ToLower(scheme) {
	case "nats", "tls":
		s, err := natssink.Dial(ctx, raw, &natssink.Config{
			Stream: f.natsStream, Subjects: f.natsSubjects, NoCreateStream: f.natsNoCreate, Logger: log,
		})
		if err != nil {
			return nil, err
		}
		if err := s.EnsureStream(ctx); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	case "kafka":
		return kafkasink.Dial(ctx, raw, &kafkasink.Config{Logger: log})
	case "amqp", "amqps":
		s, err := amqpsink.Dial(ctx, raw, &amqpsink.Config{Exchange: f.amqpExchange, Declare: f.amqpDeclare, Logger: log})
		if err != nil {
			return nil, err
		}
		if err := s.Setup(ctx); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	case "redis", "rediss":
		// go-redis logs dial retries through a process-wide logger; send
		// them to ours at debug level so a failed start-up says one line.
		redis.SetLogger(redisLogger{log})
		return redissink.Dial(ctx, raw, &redissink.Config{MaxLen: f.redisMaxLen, Logger: log})
	case "mqtt", "mqtts":
		if f.mqttQoS != 1 && f.mqttQoS != 2 {
			return nil, fmt.Errorf("--mqtt-qos %d: use 1 or 2 (QoS 0 can lose messages)", f.mqttQoS)
		}
		return mqttsink.Dial(ctx, raw, &mqttsink.Config{QoS: byte(f.mqttQoS), Logger: log})
	case "http", "https":
		secrets := f.webhookSecrets
		if len(secrets) == 0 && os.Getenv("OUTBOX_WEBHOOK_SECRETS") != "" {
			secrets = strings.Fields(os.Getenv("OUTBOX_WEBHOOK_SECRETS"))
		}
		if len(secrets) == 0 {
			return nil, errors.New("webhook sink: no signing secret: pass --webhook-secret whsec_... (or OUTBOX_WEBHOOK_SECRETS); make one with `openssl rand -base64 32` and prefix it with whsec_")
		}
		return webhooksink.New(&webhooksink.Config{URL: raw, Secrets: secrets, AllowPrivate: f.webhookPrivate, Timeout: f.webhookTimeout, Logger: log})
	case "stdout":
		if raw != "stdout:" && raw != "stdout://" {
			return nil, fmt.Errorf("--sink %q: the stdout sink takes no address; write stdout:", raw)
		}
		return stdoutsink.New(os.Stdout), nil
	default:
		return nil, fmt.Errorf("--sink %q: unknown scheme %q: use %s", redact(raw), scheme, sinkSchemes)
	}
}

// redisLogger passes go-redis's own messages to slog at debug level.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}
