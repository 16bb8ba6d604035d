// Package stdoutsink is a sink that writes each message as one JSON line to
// an io.Writer (standard output, a file, a pipe): for trying the relay out,
// debugging routes, and piping events into other tools.
//
// Each line is an object with, in this order:
//
//	"id"             the message id
//	"destination"    the routed destination
//	"key"            the key as a string, or "key_base64" (standard base64)
//	                 instead when the key is not valid UTF-8
//	"headers"        an array of {"key":..., "value":...} objects, in order
//	                 (names may repeat; the sink adds no "id" header)
//	"payload"        the value itself when it is valid JSON (compacted onto
//	                 the line), null when there is no value, or else
//	"payload_base64" the value in standard base64
//
// For example:
//
//	{"id":"1","destination":"orders","key":"o-1","headers":[{"key":"type","value":"Created"}],"payload":{"total":5}}
//
// A message counts as published once its line was written. A write error
// fails that message and the rest of the batch, transiently.
package stdoutsink
