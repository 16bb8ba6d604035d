package sqssink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox/internal/awsbatch"
	"github.com/outboxkit/outbox/internal/awsconf"
	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
)

// MaxMessageBytes is the largest message the sink sends: body and
// attributes (names, types and values), as SQS counts them.
const MaxMessageBytes = awsbatch.MaxBytes

// IDAttr is the String message attribute that carries the event id.
const IDAttr = awsbatch.IDAttr

// Defaults applied to zero Config fields.
const (
	DefaultMaxRetries = 3
	DefaultRetryDelay = 100 * time.Millisecond
)

// ErrClosed is returned for every message published after Close.
var ErrClosed = errors.New("sqssink: sink is closed")

// queueName is an SQS queue name: 1 to 80 characters, ".fifo" included.
var queueName = regexp.MustCompile(`^(?:[A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo)$`)

// Config configures a Sink. The zero value (or a nil *Config) is usable.
type Config struct {
	// Queue is the queue every message goes to: a queue name or a queue
	// URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME). Default: the
	// queue named by Message.Destination (a name or a URL).
	Queue string
	// Owner is the AWS account id that owns the queues given by name,
	// when it is not the caller's (GetQueueUrl's QueueOwnerAWSAccountId).
	Owner string
	// MaxRetries is how often a message that failed on its own
	// (throttling, an internal error of the service) is sent again within
	// one Publish. Default 3.
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
	if c.Queue != "" {
		if err := checkQueue(c.Queue); err != nil {
			return c, fmt.Errorf("sqssink: invalid Config.Queue: %v", err)
		}
	}
	if err := confval.PositiveOr("sqssink", "MaxRetries", &c.MaxRetries, DefaultMaxRetries); err != nil {
		return c, err
	}
	if err := confval.PositiveOr("sqssink", "RetryDelay", &c.RetryDelay, DefaultRetryDelay); err != nil {
		return c, err
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
}

// isURL reports whether q is a queue URL rather than a name.
func isURL(q string) bool {
	return strings.HasPrefix(q, "https://") || strings.HasPrefix(q, "http://")
}

// checkQueue says what is wrong with a queue name or URL.
func checkQueue(q string) error {
	if isURL(q) {
		u, err := url.Parse(q)
		if err != nil || u.Host == "" || !queueName.MatchString(u.Path[strings.LastIndexByte(u.Path, '/')+1:]) {
			return fmt.Errorf("queue URL %q: want https://sqs.REGION.amazonaws.com/ACCOUNT/NAME", q)
		}
		return nil
	}
	if !queueName.MatchString(q) {
		return fmt.Errorf("queue name %q: 1 to 80 of a-z A-Z 0-9 _ -, ending in .fifo for a FIFO queue", q)
	}
	return nil
}

// Sink publishes messages to SQS queues. It is safe for concurrent use;
// order is kept within one Publish call, not across concurrent calls.
type Sink struct {
	client *sqs.Client
	cfg    Config
	closed atomic.Bool

	mu   sync.Mutex
	urls map[string]string // queue name -> URL
}

var (
	_ sink.Sink     = (*Sink)(nil)
	_ sink.Systemer = (*Sink)(nil)
)

// New returns a Sink that sends through client. It does no I/O.
func New(client *sqs.Client, cfg *Config) (*Sink, error) {
	if client == nil {
		return nil, errors.New("sqssink: New: nil *sqs.Client")
	}
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	return &Sink{client: client, cfg: c, urls: map[string]string{}}, nil
}

// URL is a parsed sqs:// sink URL.
type URL struct {
	// Queue is the queue name; empty when the URL names none (then each
	// message goes to the queue its Destination names).
	Queue string
	// Region, Endpoint and Owner are the parameters region=, endpoint=
	// and owner=, empty when not given.
	Region, Endpoint, Owner string
}

const urlForm = "sqs://[QUEUE]?region=REGION[&endpoint=URL][&owner=ACCOUNT]"

// ParseURL parses sqs://[QUEUE]?region=REGION[&endpoint=URL][&owner=ACCOUNT].
// Credentials never come from the URL.
func ParseURL(rawURL string) (URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return URL{}, fmt.Errorf("sqssink: invalid sink URL: want %s", urlForm)
	}
	if u.Scheme != "sqs" || u.User != nil || (u.Path != "" && u.Path != "/") || u.Fragment != "" || u.Port() != "" {
		return URL{}, fmt.Errorf("sqssink: invalid sink URL %q: want %s (credentials come from the environment, not the URL)", u.Redacted(), urlForm)
	}
	q, err := awsconf.Query("sqssink", u, "region, endpoint and owner", "region", "endpoint", "owner")
	if err != nil {
		return URL{}, err
	}
	if u.Host != "" && !queueName.MatchString(u.Host) {
		return URL{}, fmt.Errorf("sqssink: sink URL %q: queue name %q: 1 to 80 of a-z A-Z 0-9 _ -, ending in .fifo for a FIFO queue", u.Redacted(), u.Host)
	}
	return URL{Queue: u.Host, Region: q.Get("region"), Endpoint: q.Get("endpoint"), Owner: q.Get("owner")}, nil
}

// NewClient returns an SQS client on the SDK's usual configuration
// (credentials from the environment, shared files or the instance role;
// AWS_ENDPOINT_URL_SQS), in region and sending to endpoint when they are
// not empty.
func NewClient(ctx context.Context, region, endpoint string) (*sqs.Client, error) {
	awsCfg, err := awsconf.Load(ctx, "sqssink", region)
	if err != nil {
		return nil, err
	}
	var opts []func(*sqs.Options)
	if endpoint != "" {
		opts = append(opts, func(o *sqs.Options) { o.BaseEndpoint = aws.String(endpoint) })
	}
	return sqs.NewFromConfig(awsCfg, opts...), nil
}

// Dial loads the SDK's default configuration for the sink URL (ParseURL,
// NewClient) and returns a Sink on it. It does no I/O beyond loading the
// configuration; queues are looked up on first use.
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Sink, error) {
	pu, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if pu.Queue != "" {
		c.Queue = pu.Queue
	}
	if pu.Owner != "" {
		c.Owner = pu.Owner
	}
	client, err := NewClient(ctx, pu.Region, pu.Endpoint)
	if err != nil {
		return nil, err
	}
	return New(client, &c)
}

// System names the broker for tracing (messaging.system).
func (s *Sink) System() string { return "aws_sqs" }

// Close marks the sink closed and closes the idle HTTP connections of its
// client when its HTTPClient has a CloseIdleConnections method (Dial's and
// NewClient's do; the client stays usable). It is idempotent.
func (s *Sink) Close() error {
	s.closed.Store(true)
	awsconf.CloseIdle(s.client.Options().HTTPClient)
	return nil
}

// queueURL returns the URL of queue q (a name or a URL), looked up once.
func (s *Sink) queueURL(ctx context.Context, q string) (string, error) {
	if isURL(q) {
		return q, nil
	}
	s.mu.Lock()
	u, ok := s.urls[q]
	s.mu.Unlock()
	if ok {
		return u, nil
	}
	in := &sqs.GetQueueUrlInput{QueueName: aws.String(q)}
	if s.cfg.Owner != "" {
		in.QueueOwnerAWSAccountId = aws.String(s.cfg.Owner)
	}
	out, err := s.client.GetQueueUrl(ctx, in)
	if err != nil {
		var missing *types.QueueDoesNotExist
		if errors.As(err, &missing) && ctx.Err() == nil {
			return "", fmt.Errorf("sqssink: queue %q does not exist (create it; the relay retries): %w", q, err)
		}
		return "", awsbatch.Lookup(ctx, "sqssink", fmt.Sprintf("look up queue %q", q), err)
	}
	s.mu.Lock()
	s.urls[q] = aws.ToString(out.QueueUrl)
	s.mu.Unlock()
	return aws.ToString(out.QueueUrl), nil
}

// Publish sends msgs in SendMessageBatch requests and returns one result
// per message; see the package doc for batching, order and errors.
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
	urls := map[string]string{}
	failed := map[string]error{}
	entries := make([]*awsbatch.Entry, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		q := s.cfg.Queue
		if q == "" {
			q = m.Destination
			if err := checkQueue(q); err != nil {
				errs[i] = sink.Permanent(fmt.Errorf("sqssink: message %s: %v", m.ID, err))
				continue
			}
		}
		if err, ok := failed[q]; ok {
			errs[i] = err
			continue
		}
		qurl, ok := urls[q]
		if !ok {
			var err error
			if qurl, err = s.queueURL(ctx, q); err != nil {
				failed[q], errs[i] = err, err
				continue
			}
			urls[q] = qurl
		}
		e, err := entry(i, m, qurl)
		if err != nil {
			errs[i] = err
			continue
		}
		entries = append(entries, e)
	}
	awsbatch.Run(ctx, awsbatch.Config{Prefix: "sqssink", MaxRetries: s.cfg.MaxRetries, RetryDelay: s.cfg.RetryDelay}, entries, errs, s.send)
	return errs
}

// entry builds the batch entry of msgs[i] for the queue at qurl, or a
// permanent error.
func entry(i int, m *sink.Message, qurl string) (*awsbatch.Entry, error) {
	body, err := sink.Envelope(m)
	if err != nil {
		return nil, sink.Permanent(fmt.Errorf("sqssink: message %s: %w", m.ID, err))
	}
	attrs := map[string]string{IDAttr: m.ID}
	size := awsbatch.Size(string(body), attrs)
	if size > MaxMessageBytes {
		return nil, sink.Permanent(fmt.Errorf("sqssink: message %s: %d bytes with its attributes, over SQS's limit of %d", m.ID, size, MaxMessageBytes))
	}
	e := types.SendMessageBatchRequestEntry{
		MessageBody: aws.String(string(body)),
		MessageAttributes: map[string]types.MessageAttributeValue{
			IDAttr: {DataType: aws.String("String"), StringValue: aws.String(m.ID)},
		},
	}
	var lane string
	if awsbatch.IsFIFO(qurl) {
		key := string(m.Key)
		if key == "" {
			key = m.ID
		}
		lane = awsbatch.FIFOID(key)
		e.MessageGroupId = aws.String(lane)
		e.MessageDeduplicationId = aws.String(awsbatch.FIFOID(m.ID))
	}
	return &awsbatch.Entry{Index: i, ID: m.ID, Dest: qurl, Lane: lane, Size: size, Data: e}, nil
}

// send sends one SendMessageBatch request.
func (s *Sink) send(ctx context.Context, qurl string, es []*awsbatch.Entry) ([]awsbatch.Result, error) {
	entries := make([]types.SendMessageBatchRequestEntry, len(es))
	for j, e := range es {
		entries[j] = e.Data.(types.SendMessageBatchRequestEntry)
		entries[j].Id = aws.String(strconv.Itoa(j))
	}
	out, err := s.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(qurl), Entries: entries})
	if err != nil {
		return nil, awsbatch.Classify(ctx, "sqssink", "send to "+qurl, err)
	}
	stored := make([]string, len(out.Successful))
	for k, ok := range out.Successful {
		stored[k] = aws.ToString(ok.Id)
	}
	failed := make([]awsbatch.Failure, len(out.Failed))
	for k, f := range out.Failed {
		failed[k] = awsbatch.Failure{ID: aws.ToString(f.Id), Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
	}
	return awsbatch.Results("sqssink", "send to "+qurl, es, stored, failed), nil
}
