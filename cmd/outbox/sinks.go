package main

import (
	"fmt"
	"os"
	"time"

	"github.com/outboxkit/outbox/sink/sinkurl"
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
	pubsubCreate   bool
}

const sinkSchemes = sinkurl.Schemes

// url is --sink, or OUTBOX_SINK.
func (f *sinkFlags) sinkURL() (string, error) {
	raw := f.url
	if raw == "" {
		raw = os.Getenv("OUTBOX_SINK")
	}
	if raw == "" {
		return "", fmt.Errorf("no sink: pass --sink %s, or set OUTBOX_SINK", sinkSchemes)
	}
	return raw, nil
}

// options are the broker-specific flags as sinkurl's options.
func (f *sinkFlags) options() (sinkurl.Options, error) {
	if f.mqttQoS != 1 && f.mqttQoS != 2 {
		return sinkurl.Options{}, fmt.Errorf("--mqtt-qos %d: use 1 or 2 (QoS 0 can lose messages)", f.mqttQoS)
	}
	return sinkurl.Options{
		NATSStream: f.natsStream, NATSSubjects: f.natsSubjects, NATSNoCreate: f.natsNoCreate,
		AMQPExchange: f.amqpExchange, AMQPDeclare: f.amqpDeclare,
		RedisMaxLen: f.redisMaxLen, MQTTQoS: f.mqttQoS,
		WebhookSecrets: f.webhookSecrets, WebhookAllowPrivate: f.webhookPrivate, WebhookTimeout: f.webhookTimeout,
		PubSubCreateTopics: f.pubsubCreate,
	}, nil
}
