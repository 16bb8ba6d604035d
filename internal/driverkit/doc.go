// Package driverkit is what the database drivers of this module share
// beyond the seam (package outboxdriver): the state of a claimed batch and
// of a source, the split of a batch's outcome into its statements, the
// bounded error text, header decoding, lease helpers, the rendered names
// of a table's companions, and the rules the drivers apply alike (failure
// classes, delayed rows, the writers' wake-up protocol).
//
// A driver keeps only what its SQL dialect forces; everything here is
// written once. It is internal: the seam is what a driver implements, and
// this kit may change with any release.
package driverkit
