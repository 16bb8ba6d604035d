package kinesissink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/smithy-go"

	"github.com/outboxkit/outbox/internal/awsconf"
	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
)

// Limits of Kinesis Data Streams.
const (
	maxRecordBytes  = 1 << 20 // data plus partition key
	maxRequestBytes = 5 << 20
	maxRequestCount = 500
	maxKeyChars     = 256
)

// Defaults applied to zero Config fields.
const (
	DefaultMaxRetries = 3
	DefaultRetryDelay = 100 * time.Millisecond
)

// ErrClosed is returned for every message published after Close.
var ErrClosed = errors.New("kinesissink: sink is closed")

var streamName = regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,128}$`)

// Config configures a Sink. The zero value (or a nil *Config) is usable.
type Config struct {
	// Stream is the stream every record goes to. Default: the stream named
	// by Message.Destination.
	Stream string
	// MaxRetries is how often a record that failed on its own (throughput
	// exceeded, internal failure) is put again within one Publish. Default 3.
	MaxRetries int
	// RetryDelay is the first back-off before such a retry; it doubles.
	// Default 100ms.
	RetryDelay time.Duration
	// Logger. Default: warnings and errors as text on standard error.
	Logger *slog.Logger
}

func normalize(cfg *Config) (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Stream != "" && !streamName.MatchString(c.Stream) {
		return c, fmt.Errorf("kinesissink: invalid Config.Stream %q: 1 to 128 of a-z A-Z 0-9 _ . -", c.Stream)
	}
	if err := confval.PositiveOr("kinesissink", "MaxRetries", &c.MaxRetries, DefaultMaxRetries); err != nil {
		return c, err
	}
	if err := confval.PositiveOr("kinesissink", "RetryDelay", &c.RetryDelay, DefaultRetryDelay); err != nil {
		return c, err
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
}

// Sink publishes messages to Kinesis. It is safe for concurrent use; order
// is kept within one Publish call, not across concurrent calls.
type Sink struct {
	client *kinesis.Client
	cfg    Config
	closed atomic.Bool
}

var (
	_ sink.Sink     = (*Sink)(nil)
	_ sink.Systemer = (*Sink)(nil)
)

// New returns a Sink that puts records through client. It does no I/O.
func New(client *kinesis.Client, cfg *Config) (*Sink, error) {
	if client == nil {
		return nil, errors.New("kinesissink: New: nil *kinesis.Client")
	}
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	return &Sink{client: client, cfg: c}, nil
}

// ParseURL splits kinesis://[STREAM]?region=REGION[&endpoint=URL] into its
// stream (empty when the URL names none), region and endpoint (each empty
// when not given).
func ParseURL(rawURL string) (stream, region, endpoint string, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", "", "", errors.New("kinesissink: invalid sink URL: want kinesis://STREAM?region=REGION")
	}
	q := u.Query()
	if u.Scheme != "kinesis" || u.User != nil || (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return "", "", "", fmt.Errorf("kinesissink: invalid sink URL %q: want kinesis://STREAM?region=REGION[&endpoint=URL] (credentials come from the environment, not the URL)", u.Redacted())
	}
	for k := range q {
		if k != "region" && k != "endpoint" {
			return "", "", "", fmt.Errorf("kinesissink: sink URL %q: unknown parameter %q; use region and endpoint", u.Redacted(), k)
		}
	}
	return u.Host, q.Get("region"), q.Get("endpoint"), nil
}

// NewClient returns a Kinesis client on the SDK's usual configuration
// (credentials from the environment, shared files or the instance role;
// AWS_ENDPOINT_URL_KINESIS), in region and sending to endpoint when they
// are not empty. Its HTTP client is one of its own, so that a Sink's Close
// can end its idle connections.
func NewClient(ctx context.Context, region, endpoint string) (*kinesis.Client, error) {
	awsCfg, err := awsconf.Load(ctx, "kinesissink", region)
	if err != nil {
		return nil, err
	}
	var kopts []func(*kinesis.Options)
	if endpoint != "" {
		kopts = append(kopts, func(o *kinesis.Options) { o.BaseEndpoint = aws.String(endpoint) })
	}
	return kinesis.NewFromConfig(awsCfg, kopts...), nil
}

// Dial loads the SDK's default configuration for
// kinesis://STREAM?region=REGION[&endpoint=URL] (ParseURL, NewClient) and
// returns a Sink on it.
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Sink, error) {
	stream, region, endpoint, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if stream != "" {
		c.Stream = stream
	}
	if c.Stream == "" {
		u, _ := url.Parse(rawURL)
		return nil, fmt.Errorf("kinesissink: sink URL %q names no stream: want kinesis://STREAM?region=REGION", u.Redacted())
	}
	client, err := NewClient(ctx, region, endpoint)
	if err != nil {
		return nil, err
	}
	return New(client, &c)
}

// System names the broker for tracing (messaging.system).
func (s *Sink) System() string { return "aws_kinesis" }

// Close marks the sink closed and closes the idle HTTP connections of its
// client when its HTTPClient has a CloseIdleConnections method (Dial's and
// NewClient's do; the client stays usable). It is idempotent.
func (s *Sink) Close() error {
	s.closed.Store(true)
	awsconf.CloseIdle(s.client.Options().HTTPClient)
	return nil
}

// record is one message on its way.
type record struct {
	i      int // index into msgs
	stream string
	key    string
	data   []byte
	size   int
}

// Publish puts msgs and returns one result per message; see the package
// doc for batching and order.
func (s *Sink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	if s.closed.Load() {
		return sink.Results(len(msgs), ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return sink.Results(len(msgs), err)
	}
	type lane struct{ stream, key string }
	queues := map[lane][]*record{}
	var order []lane
	for i := range msgs {
		r, err := s.record(i, &msgs[i])
		if err != nil {
			errs[i] = err
			continue
		}
		l := lane{r.stream, r.key}
		if _, ok := queues[l]; !ok {
			order = append(order, l)
		}
		queues[l] = append(queues[l], r)
	}
	retries := map[int]int{}
	for len(order) > 0 {
		// One request per stream, each holding the head of every lane.
		byStream := map[string][]*record{}
		var streams []string
		bytes := map[string]int{}
		for _, l := range order {
			r := queues[l][0]
			if len(byStream[r.stream]) >= maxRequestCount || bytes[r.stream]+r.size > maxRequestBytes {
				continue
			}
			if _, ok := byStream[r.stream]; !ok {
				streams = append(streams, r.stream)
			}
			byStream[r.stream] = append(byStream[r.stream], r)
			bytes[r.stream] += r.size
		}
		// delay is the back-off before the next round, set by the record
		// retried most often in this one.
		var delay time.Duration
		for _, st := range streams {
			rs := byStream[st]
			failed, err := s.put(ctx, st, rs)
			for j, r := range rs {
				l := lane{r.stream, r.key}
				switch {
				case err != nil:
					// The request failed as a whole: this lane's head fails
					// with its error, the records behind it are not sent.
					errs[r.i] = err
					for _, q := range queues[l][1:] {
						errs[q.i] = notSent(msgs[q.i].ID, err)
					}
					delete(queues, l)
				case failed[j] == nil:
					queues[l] = queues[l][1:]
					if len(queues[l]) == 0 {
						delete(queues, l)
					}
				case retries[r.i] < s.cfg.MaxRetries:
					retries[r.i]++
					delay = max(delay, s.cfg.RetryDelay<<(retries[r.i]-1))
				default:
					errs[r.i] = failed[j]
					for _, q := range queues[l][1:] {
						errs[q.i] = notSent(msgs[q.i].ID, failed[j])
					}
					delete(queues, l)
				}
			}
		}
		kept := order[:0]
		for _, l := range order {
			if _, ok := queues[l]; ok {
				kept = append(kept, l)
			}
		}
		order = kept
		if delay > 0 && len(order) > 0 {
			timer := time.NewTimer(delay)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				for _, l := range order {
					for _, q := range queues[l] {
						errs[q.i] = ctx.Err()
					}
				}
				return errs
			}
		}
	}
	return errs
}

// notSent is the error of a record held back behind a failed one of its
// key: transient (unavailable if the failure was), never permanent.
func notSent(id string, err error) error {
	e := fmt.Errorf("kinesissink: message %s not sent: an earlier record with its partition key failed: %v", id, err)
	if sink.IsUnavailable(err) {
		return sink.Unavailable(e)
	}
	return e
}

// record builds the record of msgs[i], or a permanent error.
func (s *Sink) record(i int, m *sink.Message) (*record, error) {
	stream := s.cfg.Stream
	if stream == "" {
		stream = m.Destination
	}
	if !streamName.MatchString(stream) {
		return nil, sink.Permanent(fmt.Errorf("kinesissink: message %s: invalid stream name %q: 1 to 128 of a-z A-Z 0-9 _ . -", m.ID, stream))
	}
	key := string(m.Key)
	if len(m.Key) == 0 {
		key = m.ID
	}
	if !utf8.ValidString(key) || utf8.RuneCountInString(key) > maxKeyChars {
		return nil, sink.Permanent(fmt.Errorf("kinesissink: message %s: partition key must be 1 to %d characters of UTF-8", m.ID, maxKeyChars))
	}
	data, err := sink.Envelope(m)
	if err != nil {
		return nil, sink.Permanent(fmt.Errorf("kinesissink: message %s: %w", m.ID, err))
	}
	size := len(data) + len(key)
	if size > maxRecordBytes {
		return nil, sink.Permanent(fmt.Errorf("kinesissink: message %s: record of %d bytes, over Kinesis's 1 MiB limit", m.ID, size))
	}
	return &record{i: i, stream: stream, key: key, data: data, size: size}, nil
}

// put sends one PutRecords request and returns each record's error, or the
// request's.
func (s *Sink) put(ctx context.Context, stream string, rs []*record) ([]error, error) {
	entries := make([]types.PutRecordsRequestEntry, len(rs))
	for j, r := range rs {
		entries[j] = types.PutRecordsRequestEntry{Data: r.data, PartitionKey: aws.String(r.key)}
	}
	out, err := s.client.PutRecords(ctx, &kinesis.PutRecordsInput{StreamName: aws.String(stream), Records: entries})
	if err != nil {
		return nil, classify(stream, err, ctx)
	}
	if len(out.Records) != len(rs) {
		return nil, fmt.Errorf("kinesissink: PutRecords to %q answered %d results for %d records", stream, len(out.Records), len(rs))
	}
	failed := make([]error, len(rs))
	for j, res := range out.Records {
		if res.ErrorCode != nil {
			failed[j] = fmt.Errorf("kinesissink: put record to %q: %s: %s", stream, aws.ToString(res.ErrorCode), aws.ToString(res.ErrorMessage))
		}
	}
	return failed, nil
}

// classify marks a request error for the relay.
func classify(stream string, err error, ctx context.Context) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var notFound *types.ResourceNotFoundException
	if errors.As(err, &notFound) {
		return fmt.Errorf("kinesissink: stream %q: %w (create the stream; the relay retries)", stream, err)
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		if api.ErrorCode() == "ValidationException" || api.ErrorCode() == "InvalidArgumentException" {
			return sink.Permanent(fmt.Errorf("kinesissink: put records to %q: %w", stream, err))
		}
		return fmt.Errorf("kinesissink: put records to %q: %w", stream, err)
	}
	// No answer from the service: connection refused, reset, timeout.
	return sink.Unavailable(fmt.Errorf("kinesissink: put records to %q: %w", stream, err))
}
