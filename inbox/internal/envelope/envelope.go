// Package envelope reads the JSON envelope of sink.Envelope, which the
// sinks for brokers without headers (mqttsink, kinesissink) publish, into an
// inbox message. The adapters of those brokers share it.
package envelope

import (
	"encoding/base64"
	"encoding/json"

	"github.com/outboxkit/outbox/inbox"
)

// wire is sink.Envelope's JSON.
type wire struct {
	ID            string          `json:"id"`
	Destination   string          `json:"destination"`
	Key           *string         `json:"key"`
	KeyBase64     *string         `json:"key_base64"`
	Headers       []header        `json:"headers"`
	Payload       json.RawMessage `json:"payload"`
	PayloadBase64 *string         `json:"payload_base64"`
}

type header struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Message reads data as an envelope. Anything else (not JSON, no id, a
// payload_base64 that does not decode) becomes a message without an event
// id, whose payload is data as received, with the given destination: the
// inbox refuses it and it is dead-lettered as it came. destination is also
// used when the envelope has none.
func Message(destination string, data []byte) inbox.Message {
	var e wire
	if err := json.Unmarshal(data, &e); err != nil || e.ID == "" {
		return inbox.NewMessage(destination, nil, nil, data)
	}
	var payload []byte
	switch {
	case e.PayloadBase64 != nil:
		p, err := base64.StdEncoding.DecodeString(*e.PayloadBase64)
		if err != nil {
			return inbox.NewMessage(destination, nil, nil, data)
		}
		payload = p
	case len(e.Payload) > 0 && string(e.Payload) != "null":
		payload = e.Payload
	}
	hdr := make(map[string]string, len(e.Headers)+1)
	for _, h := range e.Headers {
		if _, ok := hdr[h.Key]; !ok {
			hdr[h.Key] = h.Value
		}
	}
	if _, ok := hdr[inbox.HeaderID]; !ok {
		hdr[inbox.HeaderID] = e.ID
	}
	var key []byte
	switch {
	case e.Key != nil:
		key = []byte(*e.Key)
	case e.KeyBase64 != nil:
		key, _ = base64.StdEncoding.DecodeString(*e.KeyBase64)
	}
	if e.Destination != "" {
		destination = e.Destination
	}
	return inbox.NewMessage(destination, key, hdr, payload)
}
