// Package docsnippets checks that the Go code in the documentation compiles.
//
// It has no code of its own: its test reads README.md and docs/*.md, takes
// every fenced code block opened with ```go, and builds them all with one
// `go build` run from the module root, so that a snippet that no longer
// matches the API fails the test suite with the file and the line of the
// block.
//
// The rule a snippet follows:
//
//   - A block whose first line that is neither blank nor a // comment
//     starts with "package " is a complete Go file. It is built as it is,
//     as a package of its own (a package main is built, never run).
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
package docsnippets
