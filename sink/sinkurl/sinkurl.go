// Package sinkurl opens a sink from a URL, as `outbox relay --sink` does:
// nats://, kafka://, amqp://, redis://, mqtt://, pubsub://, kinesis://,
// sqs://, sns://, https:// or stdout: (Schemes), with the broker-specific
// options of the command's flags (Options).
//
//	snk, err := sinkurl.Open(ctx, "nats://nats:4222", nil, nil)
//	if err != nil {
//		return err
//	}
//	rl, err := relayd.Open(ctx, dbURL, snk, nil)
//
// It links every broker's client. A program that publishes to one broker
// opens its sink through that sink's package instead (natssink.DialStream,
// kafkasink.Dial, ...) and links only that client.
package sinkurl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/amqpsink"
	"github.com/outboxkit/outbox/sink/kafkasink"
	"github.com/outboxkit/outbox/sink/kinesissink"
	"github.com/outboxkit/outbox/sink/mqttsink"
	"github.com/outboxkit/outbox/sink/natssink"
	"github.com/outboxkit/outbox/sink/pubsubsink"
	"github.com/outboxkit/outbox/sink/redissink"
	"github.com/outboxkit/outbox/sink/snssink"
	"github.com/outboxkit/outbox/sink/sqssink"
	"github.com/outboxkit/outbox/sink/stdoutsink"
	"github.com/outboxkit/outbox/sink/webhooksink"
)

// Schemes lists the sink URL forms, for messages.
const Schemes = "nats://host:port, kafka://host:port[,host:port], amqp://user:pass@host:port/vhost, redis://host:port/db, mqtt://host:port, pubsub://project[/topic], kinesis://stream?region=..., sqs://queue?region=..., sns://topic?region=..., https://host/path/${destination} or stdout:"

// Options are the broker-specific options of a sink opened from a URL
// (the NATS stream, the AMQP exchange, the MQTT QoS, the webhook secrets,
// ...). Zero values take the defaults of `outbox relay`'s flags.
type Options struct {
	// NATSStream is the JetStream stream the events go to (default
	// OUTBOX); NATSSubjects its subjects when it is created (default
	// outbox.event.>); NATSNoCreate fails instead of creating a missing
	// stream.
	NATSStream   string
	NATSSubjects []string
	NATSNoCreate bool
	// AMQPExchange is the RabbitMQ exchange (default outbox); AMQPDeclare
	// declares it (durable, topic) at start-up.
	AMQPExchange string
	AMQPDeclare  bool
	// RedisMaxLen trims each Redis stream to about this many entries (0:
	// never).
	RedisMaxLen int64
	// MQTTQoS is 1 (the default) or 2.
	MQTTQoS int
	// WebhookSecrets sign webhooks (Standard Webhooks, whsec_...);
	// WebhookAllowPrivate allows targets on private addresses;
	// WebhookTimeout bounds one request (default 10s).
	WebhookSecrets      []string
	WebhookAllowPrivate bool
	WebhookTimeout      time.Duration
	// PubSubCreateTopics creates a missing Pub/Sub topic on first use.
	PubSubCreateTopics bool
}

// Open connects to the broker raw names (nats://, kafka://, amqp://,
// redis://, mqtt://, pubsub://, kinesis://, sqs://, sns://, https:// or
// stdout:;
// Schemes) with the options o (nil: the defaults), and creates the
// NATS stream or declares the AMQP exchange when o asks. Close the sink
// when done.
func Open(ctx context.Context, raw string, o *Options, log *slog.Logger) (sink.Sink, error) {
	if o == nil {
		o = &Options{}
	}
	log = confval.Logger(log)
	scheme, _, ok := strings.Cut(raw, ":")
	if !ok {
		return nil, fmt.Errorf("sink URL %q has no scheme: use %s", confval.RedactURL(raw), Schemes)
	}
	switch strings.ToLower(scheme) {
	case "nats", "tls":
		return opened(natssink.DialStream(ctx, raw, &natssink.Config{
			Stream: o.NATSStream, Subjects: o.NATSSubjects, NoCreateStream: o.NATSNoCreate, Logger: log,
		}))
	case "kafka":
		return opened(kafkasink.Dial(ctx, raw, &kafkasink.Config{Logger: log}))
	case "amqp", "amqps":
		s, err := amqpsink.Dial(ctx, raw, &amqpsink.Config{Exchange: o.AMQPExchange, Declare: o.AMQPDeclare, Logger: log})
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
		return opened(redissink.Dial(ctx, raw, &redissink.Config{MaxLen: o.RedisMaxLen, Logger: log}))
	case "mqtt", "mqtts":
		qos := o.MQTTQoS
		if qos == 0 {
			qos = 1
		}
		if qos != 1 && qos != 2 {
			return nil, fmt.Errorf("MQTT QoS %d: use 1 or 2 (QoS 0 can lose messages)", o.MQTTQoS)
		}
		return opened(mqttsink.Dial(ctx, raw, &mqttsink.Config{QoS: byte(qos), Logger: log}))
	case "pubsub":
		return opened(pubsubsink.Dial(ctx, raw, &pubsubsink.Config{CreateTopics: o.PubSubCreateTopics, Logger: log}))
	case "kinesis":
		return opened(kinesissink.Dial(ctx, raw, &kinesissink.Config{Logger: log}))
	case "sqs":
		return opened(sqssink.Dial(ctx, raw, &sqssink.Config{Logger: log}))
	case "sns":
		return opened(snssink.Dial(ctx, raw, &snssink.Config{Logger: log}))
	case "http", "https":
		secrets := o.WebhookSecrets
		if len(secrets) == 0 && os.Getenv("OUTBOX_WEBHOOK_SECRETS") != "" {
			secrets = strings.Fields(os.Getenv("OUTBOX_WEBHOOK_SECRETS"))
		}
		if len(secrets) == 0 {
			return nil, errors.New("webhook sink: no signing secret: pass --webhook-secret whsec_... (or OUTBOX_WEBHOOK_SECRETS); make one with `openssl rand -base64 32` and prefix it with whsec_")
		}
		return opened(webhooksink.New(&webhooksink.Config{URL: raw, Secrets: secrets, AllowPrivate: o.WebhookAllowPrivate, Timeout: o.WebhookTimeout, Logger: log}))
	case "stdout":
		if raw != "stdout:" && raw != "stdout://" {
			return nil, fmt.Errorf("sink URL %q: the stdout sink takes no address; write %q", raw, "stdout:")
		}
		return stdoutsink.New(os.Stdout), nil
	default:
		return nil, fmt.Errorf("sink URL %q: unknown scheme %q: use %s", confval.RedactURL(raw), scheme, Schemes)
	}
}

// opened returns s as a sink.Sink, or a nil one when err is set: a nil
// *T in a sink.Sink would not be nil, and its Close would panic.
func opened[T sink.Sink](s T, err error) (sink.Sink, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}

// redisLogger passes go-redis's own messages to slog at debug level.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}
