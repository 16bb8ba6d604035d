// Package console is the operator's web console and JSON API over package
// ops: an overview of the outbox, the dead letters (list, filter, detail,
// retry, discard) and the audit, for users with the roles viewer,
// operator and approver.
//
// Pages are rendered on the server with html/template from files embedded
// in the binary; they work without JavaScript (a small script only
// refreshes the overview). The JSON API lives under /api/v1 and is
// described by the OpenAPI document the server serves at
// /api/v1/openapi.json.
//
// Security fails closed: New refuses a configuration without users unless
// Config.Dev is set. Browsers sign in with a password and get an HttpOnly,
// SameSite=Strict session cookie (Secure when Config.SecureCookies is
// set); every state change carries the session's CSRF token and must come
// from the console's own origin. API clients send Authorization: Bearer
// with their token. Failed sign-ins are rate-limited. Every page carries a
// Content-Security-Policy with a fresh nonce per response and
// default-src 'none'. Every sign-in, failed sign-in and refused request is
// audited, and every action is audited by package ops.
//
// `outbox console` runs it; docs/console.md tells how to operate it.
package console
