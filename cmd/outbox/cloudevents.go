package main

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/route"
)

// cloudEventsFlags are --cloudevents and --cloudevents-source.
type cloudEventsFlags struct {
	mode, source string
}

func (f *cloudEventsFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.mode, "cloudevents", "", "publish CloudEvents 1.0: binary (attributes as the binding's headers) or structured (a JSON envelope); off when empty")
	cmd.Flags().StringVar(&f.source, "cloudevents-source", "", "with --cloudevents: the events' source, a URI-reference (default /outbox/SCHEMA.TABLE)")
}

// config returns the CloudEvents configuration for the sink --sink names,
// or nil without --cloudevents. The binding's header prefix follows the
// sink; MQTT 3.1.1 has no headers, so only structured mode goes there.
func (f *cloudEventsFlags) config(sf *sinkFlags, t outboxdriver.Table, reg *contract.Registry) (*route.CloudEvents, error) {
	if f.mode == "" {
		if f.source != "" {
			return nil, errors.New("--cloudevents-source goes with --cloudevents")
		}
		return nil, nil
	}
	ce := &route.CloudEvents{Mode: route.CloudEventsMode(f.mode), Source: f.source}
	if ce.Mode != route.Binary && ce.Mode != route.Structured {
		return nil, fmt.Errorf("--cloudevents %q: use binary or structured", f.mode)
	}
	if ce.Source == "" {
		ce.Source = "/outbox/" + t.Name
		if t.Schema != "" {
			ce.Source = "/outbox/" + t.Schema + "." + t.Name
		}
	}
	raw, err := sf.sinkURL()
	if err != nil {
		return nil, err
	}
	scheme := raw
	if u, err := url.Parse(raw); err == nil {
		scheme = u.Scheme
	}
	switch scheme {
	case "kafka", "redis", "rediss":
		ce.Prefix = route.PrefixKafka
	case "amqp", "amqps":
		ce.Prefix = route.PrefixAMQP
	case "mqtt", "mqtts":
		if ce.Mode == route.Binary {
			return nil, errors.New("--cloudevents binary: MQTT 3.1.1 has no message headers; use --cloudevents structured")
		}
	default: // nats, http(s) webhooks, stdout
		ce.Prefix = route.PrefixHTTP
	}
	if reg != nil {
		ce.DataSchema = reg.DataSchema
	}
	return ce, nil
}
