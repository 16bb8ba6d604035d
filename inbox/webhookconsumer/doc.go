// Package webhookconsumer is the receiving end of webhooksink: an
// http.Handler that verifies each request's Standard Webhooks signature
// and timestamp and handles the event through an inbox, answering so that
// the sender retries exactly when the effect did not commit.
//
// # Answers
//
//   - 2xx (204) only once the effect and the inbox row committed, or when
//     the inbox already holds the event (a retry or a replay inside the
//     tolerance window: a duplicate, no second effect) or the version
//     guard found it stale.
//   - 5xx (500) when the handler or the database failed, or the handler
//     panicked: the transaction rolled back, nothing is recorded, and the
//     sender (webhooksink counts 5xx as transient) sends the event again.
//   - 422 when the event can never be handled (a handler error marked
//     consumer.Permanent, an event id that is not a UUID), after it was
//     recorded in the inbox's dead letters; 500 if that record failed.
//     webhooksink counts other 4xx as permanent, so the relay stops
//     retrying and dead-letters it on its side too.
//   - 400 for a request without the webhook-id, webhook-timestamp or
//     webhook-signature header, or with a timestamp outside
//     Config.Tolerance of the receiver's clock (a replay of an old
//     request, or a skewed clock); 401 when no signature matches a secret;
//     405 for a method other than POST; 413 for a body over
//     Config.MaxBodyBytes. Nothing is handled or recorded for those.
//
// A request is handled once per attempt: there is no retry inside the
// receiver, the sender's retries are the attempts (the relay's MaxAttempts
// and backoff). Stop the server with http.Server.Shutdown: it lets the
// requests in flight finish, commit and answer.
//
// # What it reads
//
// The event id is the header Id (webhooksink sends it, or the message's
// own "id" header), else webhook-id; the aggregate id is Outbox-Key (or
// Outbox-Key-Base64); the destination is the last segment of the request
// path (webhooksink's "${destination}" placeholder), unless
// Config.Destination says otherwise, so a path ending in
// outbox.event.<type> gives the aggregate type. Headers are passed on with
// lower-case names, the first value of each. The body is the payload, byte
// for byte.
package webhookconsumer
