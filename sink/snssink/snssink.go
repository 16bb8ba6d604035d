package snssink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/outboxkit/outbox/internal/awsbatch"
	"github.com/outboxkit/outbox/internal/awsconf"
	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
)

// MaxMessageBytes is the largest message the sink publishes: message and
// attributes (names, types and values), as SNS counts them.
const MaxMessageBytes = awsbatch.MaxBytes

// IDAttr is the String message attribute that carries the event id.
const IDAttr = awsbatch.IDAttr

// Defaults applied to zero Config fields.
const (
	DefaultMaxRetries = 3
	DefaultRetryDelay = 100 * time.Millisecond
)

// ErrClosed is returned for every message published after Close.
var ErrClosed = errors.New("snssink: sink is closed")

// topicName is an SNS topic name: 1 to 256 characters, ".fifo" included.
var topicName = regexp.MustCompile(`^(?:[A-Za-z0-9_-]{1,256}|[A-Za-z0-9_-]{1,251}\.fifo)$`)

// topicARN is arn:PARTITION:sns:REGION:ACCOUNT:NAME.
var topicARN = regexp.MustCompile(`^arn:[a-z-]+:sns:[a-z0-9-]+:[0-9]{12}:(?:[A-Za-z0-9_-]{1,256}|[A-Za-z0-9_-]{1,251}\.fifo)$`)

// Config configures a Sink. The zero value (or a nil *Config) is usable
// with destinations that are topic ARNs.
type Config struct {
	// Topic is the topic every message goes to: a topic name or ARN.
	// Default: the topic named by Message.Destination (a name or an ARN).
	Topic string
	// Account is the AWS account id of the topics given by name (their
	// ARN is arn:PARTITION:sns:REGION:ACCOUNT:NAME, in the client's
	// region). Dial finds the caller's with STS when the URL names none.
	Account string
	// MaxRetries is how often a message that failed on its own
	// (throttling, an internal error of the service) is published again
	// within one Publish. Default 3.
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
	if c.Topic != "" && !topicName.MatchString(c.Topic) && !topicARN.MatchString(c.Topic) {
		return c, fmt.Errorf("snssink: invalid Config.Topic %q: a topic name (1 to 256 of a-z A-Z 0-9 _ -, ending in .fifo for a FIFO topic) or arn:aws:sns:REGION:ACCOUNT:NAME", c.Topic)
	}
	if c.Account != "" && !regexp.MustCompile(`^[0-9]{12}$`).MatchString(c.Account) {
		return c, fmt.Errorf("snssink: invalid Config.Account %q: 12 digits", c.Account)
	}
	if err := confval.PositiveOr("snssink", "MaxRetries", &c.MaxRetries, DefaultMaxRetries); err != nil {
		return c, err
	}
	if err := confval.PositiveOr("snssink", "RetryDelay", &c.RetryDelay, DefaultRetryDelay); err != nil {
		return c, err
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
}

// Sink publishes messages to SNS topics. It is safe for concurrent use;
// order is kept within one Publish call, not across concurrent calls.
type Sink struct {
	client *sns.Client
	cfg    Config
	closed atomic.Bool
}

var (
	_ sink.Sink     = (*Sink)(nil)
	_ sink.Systemer = (*Sink)(nil)
)

// New returns a Sink that publishes through client. It does no I/O.
func New(client *sns.Client, cfg *Config) (*Sink, error) {
	if client == nil {
		return nil, errors.New("snssink: New: nil *sns.Client")
	}
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	return &Sink{client: client, cfg: c}, nil
}

// URL is a parsed sns:// sink URL.
type URL struct {
	// Topic is the topic name; empty when the URL names none (then each
	// message goes to the topic its Destination names).
	Topic string
	// Region, Endpoint and Account are the parameters region=, endpoint=
	// and account=, empty when not given.
	Region, Endpoint, Account string
}

const urlForm = "sns://[TOPIC]?region=REGION[&account=ACCOUNT][&endpoint=URL]"

// ParseURL parses sns://[TOPIC]?region=REGION[&account=ACCOUNT][&endpoint=URL].
// Credentials never come from the URL.
func ParseURL(rawURL string) (URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return URL{}, fmt.Errorf("snssink: invalid sink URL: want %s", urlForm)
	}
	if u.Scheme != "sns" || u.User != nil || (u.Path != "" && u.Path != "/") || u.Fragment != "" || u.Port() != "" {
		return URL{}, fmt.Errorf("snssink: invalid sink URL %q: want %s (credentials come from the environment, not the URL)", u.Redacted(), urlForm)
	}
	q, err := awsconf.Query("snssink", u, "region, account and endpoint", "region", "account", "endpoint")
	if err != nil {
		return URL{}, err
	}
	if u.Host != "" && !topicName.MatchString(u.Host) {
		return URL{}, fmt.Errorf("snssink: sink URL %q: topic name %q: 1 to 256 of a-z A-Z 0-9 _ -, ending in .fifo for a FIFO topic", u.Redacted(), u.Host)
	}
	return URL{Topic: u.Host, Region: q.Get("region"), Endpoint: q.Get("endpoint"), Account: q.Get("account")}, nil
}

// NewClient returns an SNS client on the SDK's usual configuration
// (credentials from the environment, shared files or the instance role;
// AWS_ENDPOINT_URL_SNS), in region and sending to endpoint when they are
// not empty.
func NewClient(ctx context.Context, region, endpoint string) (*sns.Client, error) {
	awsCfg, err := awsconf.Load(ctx, "snssink", region)
	if err != nil {
		return nil, err
	}
	var opts []func(*sns.Options)
	if endpoint != "" {
		opts = append(opts, func(o *sns.Options) { o.BaseEndpoint = aws.String(endpoint) })
	}
	return sns.NewFromConfig(awsCfg, opts...), nil
}

// Dial loads the SDK's default configuration for the sink URL (ParseURL,
// NewClient) and returns a Sink on it. Without account= it asks STS
// (GetCallerIdentity) for the caller's account, with the same
// configuration; with endpoint= it needs account=.
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Sink, error) {
	pu, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if pu.Topic != "" {
		c.Topic = pu.Topic
	}
	if pu.Account != "" {
		c.Account = pu.Account
	}
	if c.Account == "" {
		if pu.Endpoint != "" {
			return nil, fmt.Errorf("snssink: sink URL with endpoint= needs account=ACCOUNT (the account id in the topics' ARNs)")
		}
		awsCfg, err := awsconf.Load(ctx, "snssink", pu.Region)
		if err != nil {
			return nil, err
		}
		out, err := sts.NewFromConfig(awsCfg).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
		if err != nil {
			return nil, fmt.Errorf("snssink: find the AWS account for topic ARNs (or add &account=ACCOUNT to the sink URL): %w", err)
		}
		c.Account = aws.ToString(out.Account)
	}
	client, err := NewClient(ctx, pu.Region, pu.Endpoint)
	if err != nil {
		return nil, err
	}
	return New(client, &c)
}

// System names the broker for tracing (messaging.system).
func (s *Sink) System() string { return "aws_sns" }

// Close marks the sink closed and closes the idle HTTP connections of its
// client when its HTTPClient has a CloseIdleConnections method (Dial's and
// NewClient's do; the client stays usable). It is idempotent.
func (s *Sink) Close() error {
	s.closed.Store(true)
	awsconf.CloseIdle(s.client.Options().HTTPClient)
	return nil
}

// arn returns the ARN of topic t (a name or an ARN).
func (s *Sink) arn(t string) (string, error) {
	if strings.HasPrefix(t, "arn:") {
		if !topicARN.MatchString(t) {
			return "", sink.Permanent(fmt.Errorf("invalid topic ARN %q: want arn:aws:sns:REGION:ACCOUNT:NAME", t))
		}
		return t, nil
	}
	if !topicName.MatchString(t) {
		return "", sink.Permanent(fmt.Errorf("invalid topic name %q: 1 to 256 of a-z A-Z 0-9 _ -, ending in .fifo for a FIFO topic", t))
	}
	if s.cfg.Account == "" {
		// A configuration to fix, not the message's fault.
		return "", fmt.Errorf("topic %q is a name, and Config.Account is empty: set it (account= in the sink URL) or route to topic ARNs", t)
	}
	region := s.client.Options().Region
	return "arn:" + partition(region) + ":sns:" + region + ":" + s.cfg.Account + ":" + t, nil
}

// partition is the AWS partition of region.
func partition(region string) string {
	switch {
	case strings.HasPrefix(region, "cn-"):
		return "aws-cn"
	case strings.HasPrefix(region, "us-gov-"):
		return "aws-us-gov"
	}
	return "aws"
}

// Publish publishes msgs in PublishBatch requests and returns one result
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
	entries := make([]*awsbatch.Entry, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		t := s.cfg.Topic
		if t == "" {
			t = m.Destination
		}
		arn, err := s.arn(t)
		if err != nil {
			if sink.IsPermanent(err) {
				errs[i] = sink.Permanent(fmt.Errorf("snssink: message %s: %v", m.ID, err))
			} else {
				errs[i] = fmt.Errorf("snssink: message %s: %v", m.ID, err)
			}
			continue
		}
		e, err := entry(i, m, arn)
		if err != nil {
			errs[i] = err
			continue
		}
		entries = append(entries, e)
	}
	awsbatch.Run(ctx, awsbatch.Config{Prefix: "snssink", MaxRetries: s.cfg.MaxRetries, RetryDelay: s.cfg.RetryDelay}, entries, errs, s.send)
	return errs
}

// entry builds the batch entry of msgs[i] for the topic arn, or a
// permanent error.
func entry(i int, m *sink.Message, arn string) (*awsbatch.Entry, error) {
	body, err := sink.Envelope(m)
	if err != nil {
		return nil, sink.Permanent(fmt.Errorf("snssink: message %s: %w", m.ID, err))
	}
	attrs := map[string]string{IDAttr: m.ID}
	size := awsbatch.Size(string(body), attrs)
	if size > MaxMessageBytes {
		return nil, sink.Permanent(fmt.Errorf("snssink: message %s: %d bytes with its attributes, over SNS's limit of %d", m.ID, size, MaxMessageBytes))
	}
	e := types.PublishBatchRequestEntry{
		Message: aws.String(string(body)),
		MessageAttributes: map[string]types.MessageAttributeValue{
			IDAttr: {DataType: aws.String("String"), StringValue: aws.String(m.ID)},
		},
	}
	var lane string
	if awsbatch.IsFIFO(arn) {
		key := string(m.Key)
		if key == "" {
			key = m.ID
		}
		lane = awsbatch.FIFOID(key)
		e.MessageGroupId = aws.String(lane)
		e.MessageDeduplicationId = aws.String(awsbatch.FIFOID(m.ID))
	}
	return &awsbatch.Entry{Index: i, ID: m.ID, Dest: arn, Lane: lane, Size: size, Data: e}, nil
}

// send sends one PublishBatch request.
func (s *Sink) send(ctx context.Context, arn string, es []*awsbatch.Entry) ([]awsbatch.Result, error) {
	entries := make([]types.PublishBatchRequestEntry, len(es))
	for j, e := range es {
		entries[j] = e.Data.(types.PublishBatchRequestEntry)
		entries[j].Id = aws.String(strconv.Itoa(j))
	}
	out, err := s.client.PublishBatch(ctx, &sns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: entries})
	if err != nil {
		var missing *types.NotFoundException
		if errors.As(err, &missing) && ctx.Err() == nil {
			return nil, fmt.Errorf("snssink: topic %s does not exist (create it; the relay retries): %w", arn, err)
		}
		return nil, awsbatch.Classify(ctx, "snssink", "publish to "+arn, err)
	}
	stored := make([]string, len(out.Successful))
	for k, ok := range out.Successful {
		stored[k] = aws.ToString(ok.Id)
	}
	failed := make([]awsbatch.Failure, len(out.Failed))
	for k, f := range out.Failed {
		failed[k] = awsbatch.Failure{ID: aws.ToString(f.Id), Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
	}
	return awsbatch.Results("snssink", "publish to "+arn, es, stored, failed), nil
}
