// Package awsbatch sends messages in the batch requests of Amazon SQS
// (SendMessageBatch) and SNS (PublishBatch), for sink/sqssink and
// sink/snssink: up to ten entries and 256 KiB a request, one result per
// entry, order kept per message group.
//
// Entries of one lane (a FIFO message group at one destination) go out one
// per request, in order: a later entry of a lane is sent only once the
// earlier one succeeded, because a batch may store an entry after a failed
// one of the same request. Entries without a lane (standard queues and
// topics, which keep no order) share requests freely.
package awsbatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/smithy-go"

	"github.com/outboxkit/outbox/sink"
)

// Limits shared by SendMessageBatch and PublishBatch.
const (
	MaxEntries = 10
	// MaxBytes bounds one message (body and attributes: names, types and
	// values) and the sum of a request's messages.
	MaxBytes = 256 << 10
)

// Entry is one message on its way.
type Entry struct {
	// Index is the message's index in the sink's Publish call.
	Index int
	// ID is the event id, for error messages.
	ID string
	// Dest is the queue URL or topic ARN.
	Dest string
	// Lane is the FIFO message group; "" for an unordered destination.
	Lane string
	// Size counts the body and the attributes, as the service does.
	Size int
	// Data is what the sink builds the request entry from.
	Data any
}

// Result is one entry's answer within a request that succeeded.
type Result struct {
	// Err is nil when the service stored the entry.
	Err error
	// Retry says the entry failed on its own, for a reason that passes
	// (throttling, an internal error): it is sent again within the call.
	Retry bool
}

// SendFunc sends one request of entries (all to dest) and returns one
// result per entry, or the request's error (classified with [Classify]).
type SendFunc func(ctx context.Context, dest string, entries []*Entry) ([]Result, error)

// Config sets the retries within one call.
type Config struct {
	// Prefix starts error messages ("sqssink").
	Prefix string
	// MaxRetries is how often an entry answered with Retry is sent again.
	MaxRetries int
	// RetryDelay is the first back-off before such a retry; it doubles.
	RetryDelay time.Duration
}

// invalidError marks a request error that a message of the request may
// have caused (the service refused the request's content).
type invalidError struct{ err error }

func (e *invalidError) Error() string { return e.err.Error() }
func (e *invalidError) Unwrap() error { return e.err }

// Run sends entries and sets errs[e.Index] for each; errs already holds
// the errors of the messages that never became entries.
func Run(ctx context.Context, c Config, entries []*Entry, errs []error, send SendFunc) {
	type lane struct{ dest, key string }
	queues := map[lane][]*Entry{}
	var order []lane
	for _, e := range entries {
		l := lane{e.Dest, e.Lane}
		if e.Lane == "" {
			// Unordered: a lane of its own.
			l.key = fmt.Sprintf("\x00%d", e.Index)
		}
		if _, ok := queues[l]; !ok {
			order = append(order, l)
		}
		queues[l] = append(queues[l], e)
	}
	retries := map[int]int{}
	// fail ends lane l: its head fails with err, the entries behind it
	// are not sent.
	fail := func(l lane, err error) {
		q := queues[l]
		errs[q[0].Index] = err
		for _, e := range q[1:] {
			errs[e.Index] = notSent(c.Prefix, e.ID, err)
		}
		delete(queues, l)
	}
	for len(order) > 0 {
		// The head of every lane, grouped into requests per destination.
		var reqs [][]*Entry
		open := map[string]int{} // dest -> index of its open request
		bytes := map[string]int{}
		for _, l := range order {
			e := queues[l][0]
			i, ok := open[e.Dest]
			if !ok || len(reqs[i]) >= MaxEntries || bytes[e.Dest]+e.Size > MaxBytes {
				reqs = append(reqs, nil)
				i = len(reqs) - 1
				open[e.Dest] = i
				bytes[e.Dest] = 0
			}
			reqs[i] = append(reqs[i], e)
			bytes[e.Dest] += e.Size
		}
		var delay time.Duration
		for _, req := range reqs {
			results := sendSplit(ctx, c, req, send)
			for j, e := range req {
				l := lane{e.Dest, e.Lane}
				if e.Lane == "" {
					l.key = fmt.Sprintf("\x00%d", e.Index)
				}
				r := results[j]
				switch {
				case r.Err == nil:
					queues[l] = queues[l][1:]
					if len(queues[l]) == 0 {
						delete(queues, l)
					}
				case r.Retry && retries[e.Index] < c.MaxRetries:
					retries[e.Index]++
					delay = max(delay, c.RetryDelay<<(retries[e.Index]-1))
				default:
					fail(l, r.Err)
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
		if len(order) == 0 {
			return
		}
		if err := ctx.Err(); err != nil || delay > 0 {
			if err == nil {
				timer := time.NewTimer(delay)
				select {
				case <-timer.C:
				case <-ctx.Done():
					timer.Stop()
					err = ctx.Err()
				}
			}
			if err != nil {
				for _, l := range order {
					for _, e := range queues[l] {
						errs[e.Index] = err
					}
				}
				return
			}
		}
	}
}

// sendSplit sends req; when the service refuses the request for its
// content, each entry is sent alone, so that only the culprit fails, and
// permanently.
func sendSplit(ctx context.Context, c Config, req []*Entry, send SendFunc) []Result {
	results, err := send(ctx, req[0].Dest, req)
	if err == nil && len(results) != len(req) {
		err = fmt.Errorf("%s: %d results for a request of %d entries", c.Prefix, len(results), len(req))
	}
	if err == nil {
		return results
	}
	var inv *invalidError
	if !errors.As(err, &inv) {
		return failAll(len(req), err)
	}
	if len(req) == 1 {
		return []Result{{Err: sink.Permanent(err)}}
	}
	out := make([]Result, 0, len(req))
	for _, e := range req {
		out = append(out, sendSplit(ctx, c, []*Entry{e}, send)...)
	}
	return out
}

func failAll(n int, err error) []Result {
	out := make([]Result, n)
	for i := range out {
		out[i] = Result{Err: err}
	}
	return out
}

// notSent is the error of an entry held back behind a failed one of its
// lane: transient (unavailable if the failure was), never permanent.
func notSent(prefix, id string, err error) error {
	e := fmt.Errorf("%s: message %s not sent: an earlier message of its group failed: %v", prefix, id, err)
	if sink.IsUnavailable(err) {
		return sink.Unavailable(e)
	}
	return e
}

// Codes of request errors that a request's content causes: the request
// is split, and a message that still fails alone is permanent.
var invalidCodes = map[string]bool{
	// SQS
	"InvalidParameterValue": true, "InvalidMessageContents": true, "BatchRequestTooLong": true,
	"InvalidAttributeName": true, "InvalidAttributeValue": true, "MissingParameter": true,
	"AWS.SimpleQueueService.BatchRequestTooLong": true, "AWS.SimpleQueueService.InvalidBatchEntryId": true,
	"InvalidBatchEntryId": true, "ValidationError": true,
	// SNS
	"InvalidParameter": true, "ValidationException": true,
}

// Classify marks a request error for the relay: ctx's error when ctx is
// done; a content error (see invalidCodes) for splitting; other answers
// of the service (throttling, 5xx, missing queue or topic, access denied)
// transient; no answer at all [sink.Unavailable].
func Classify(ctx context.Context, prefix, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	e := fmt.Errorf("%s: %s: %w", prefix, what, err)
	var api smithy.APIError
	if errors.As(err, &api) {
		if invalidCodes[api.ErrorCode()] {
			return &invalidError{err: e}
		}
		return e
	}
	return sink.Unavailable(e)
}

// EntryResult turns one failed batch entry (code, message, sender fault)
// into its result: a sender fault is permanent (the message is at fault),
// except throttling and KMS errors, which pass; a service fault is
// retried.
func EntryResult(prefix, what, id, code, message string, senderFault bool) Result {
	err := fmt.Errorf("%s: %s: message %s: %s: %s", prefix, what, id, code, message)
	passing := strings.Contains(strings.ToLower(code), "throttl") || strings.HasPrefix(strings.ToLower(code), "kms")
	if senderFault && !passing {
		return Result{Err: sink.Permanent(err)}
	}
	return Result{Err: err, Retry: true}
}

// IsFIFO reports whether the queue or topic (name, URL or ARN) is FIFO:
// its name ends in ".fifo".
func IsFIFO(dest string) bool { return strings.HasSuffix(dest, ".fifo") }

// FIFOID returns s as a MessageGroupId or MessageDeduplicationId: s itself
// when it is 1 to 128 characters of a-z, A-Z, 0-9 and ASCII punctuation,
// else "sha256:" and the hex SHA-256 of s, so that every value maps to a
// valid id, the same one each time.
func FIFOID(s string) string {
	ok := len(s) > 0 && len(s) <= 128
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] > ' ' && s[i] < 0x7f
	}
	if ok {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// IDAttr is the message attribute that carries the event id.
const IDAttr = "id"

// Size is what the service counts of a message with body and one String
// attribute per (name, value) pair: the body and each attribute's name,
// type ("String") and value.
func Size(body string, attrs map[string]string) int {
	n := len(body)
	for k, v := range attrs {
		n += len(k) + len("String") + len(v)
	}
	return n
}

// Lookup classifies the error of a call that says nothing about any one
// message (looking a queue up): as Classify, but never to be split.
func Lookup(ctx context.Context, prefix, what string, err error) error {
	err = Classify(ctx, prefix, what, err)
	var inv *invalidError
	if errors.As(err, &inv) {
		return inv.err
	}
	return err
}

// Failure is one failed entry of a batch answer.
type Failure struct {
	ID, Code, Message string
	SenderFault       bool
}

// Results maps a batch answer (the ids of the stored entries and the
// failures; an entry's id is its index in es) to one result per entry; an
// entry the answer does not mention is retried.
func Results(prefix, what string, es []*Entry, stored []string, failed []Failure) []Result {
	results := make([]Result, len(es))
	seen := make([]bool, len(es))
	at := func(id string) int {
		j, err := strconv.Atoi(id)
		if err != nil || j < 0 || j >= len(es) || seen[j] {
			return -1
		}
		seen[j] = true
		return j
	}
	for _, id := range stored {
		at(id)
	}
	for _, f := range failed {
		if j := at(f.ID); j >= 0 {
			results[j] = EntryResult(prefix, what, es[j].ID, f.Code, f.Message, f.SenderFault)
		}
	}
	for j := range es {
		if !seen[j] {
			results[j] = Result{Err: fmt.Errorf("%s: %s: message %s: no result in the answer", prefix, what, es[j].ID), Retry: true}
		}
	}
	return results
}
