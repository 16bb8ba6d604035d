// Package docsnippets checks the documentation: that its Go code compiles
// and that its links lead somewhere.
//
// It has no code of its own. Its tests read README.md and docs/*.md.
//
// # Snippets
//
// The snippet test takes every fenced code block opened with ```go and
// builds them all with one `go build` run from the module root, so that a
// snippet that no longer matches the API fails the test suite with the
// file and the line of the block.
//
// The rule a snippet follows:
//
//   - A block whose first line that is neither blank nor a // comment
//     starts with "package " is a complete Go file. It is built as it is,
//     as a package of its own (a package main is built, never run, but
//     for the README's quick start: see below).
//   - Any other ```go block is a fragment: a list of statements. It is
//     compiled as the body of a function, in a file whose package clause is
//     generated and whose imports and package-level declarations come from
//     the HTML comment right above the block (only blank lines between
//     them), opened with "<!-- fragment-setup" and closed with "-->". That
//     comment holds Go source: the imports the fragment needs, and the
//     names it uses without declaring them, such as
//     "var ctx context.Context". Readers of the rendered page do not see
//     it. Variables the fragment declares at its top level count as used,
//     so a fragment may show `err = tx.Commit(ctx)` without handling err.
//
// For example:
//
//	<!-- fragment-setup
//	import (
//		"context"
//
//		"github.com/jackc/pgx/v5"
//		"github.com/outboxkit/outbox"
//	)
//
//	var (
//		ctx context.Context
//		tx  pgx.Tx
//		ob  *outbox.Outbox[pgx.Tx]
//	)
//	-->
//	```go
//	err := ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "42", Type: "OrderPlaced"})
//	```
//
// Blocks are built in a directory the test creates under this one and
// removes at the end; its name starts with an underscore, so that ./...
// never matches it. Compiler errors carry the Markdown file's name and
// line (through //line directives), not the generated file's.
//
// # The quick start
//
// The README's quick start (the block starting "// Command quickstart") is
// also run, on a PostgreSQL database and an embedded NATS JetStream server
// of the test's own put in place of the ones it names: it must log what it
// published where ("published OrderPlaced of order 1 to
// outbox.event.order in stream OUTBOX") and stop cleanly on SIGINT.
//
// # Links
//
// The link test checks every relative link of README.md and docs/*.md
// (inline links, images and reference definitions, outside code blocks and
// code spans): its target file or folder exists in the repository, and an
// #anchor names a heading or an explicit <a id="..."> or <a name="...">
// of the target Markdown file. A heading's anchor is GitHub's: the text as
// rendered, lowercased, every character but letters, marks, numbers, _, -
// and spaces removed, each space turned into -; a second heading with the
// same anchor gets -1, the third -2. A link into another kind of file may
// only name a line (#L12). It also checks every docs/<file>.md#<anchor>
// and README.md#<anchor> written in the module's Go files (comments and
// strings). Links with a scheme (https:, mailto:) are not followed.
package docsnippets
