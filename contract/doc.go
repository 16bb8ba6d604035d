// Package contract loads a registry of event contracts from a folder and
// checks payloads against them.
//
// A registry is a folder with an index, contracts.json, and one JSON
// Schema document per aggregate type, event type and version:
//
//	{
//	  "missing": "refuse",
//	  "sensitive": ["customer.email"],
//	  "forbidden": ["card.token"],
//	  "contracts": [
//	    {"aggregatetype": "order", "type": "OrderPlaced", "version": 1,
//	     "schema": "order/OrderPlaced.v1.json",
//	     "sensitive": ["shipping.address"]}
//	  ]
//	}
//
// A schema may mark fields itself: "x-sensitive": true (or "writeOnly":
// true) on a field's schema adds its path to the sensitive ones,
// "x-forbidden": true to the forbidden ones.
//
// The writer (outbox.Config.Contracts), the relay (relay.Config.Contracts,
// outbox relay --contracts) and the operations package (masking) load the
// same folder. An event's version travels as header eventVersion: the
// writer sets it from the latest contract unless the event gives one.
// Compare finds breaking changes between two registries (outbox contract
// check).
//
// Schemas are compiled by github.com/santhosh-tekuri/jsonschema/v6, which
// judges every payload it sees. A contract whose schema uses only the
// common keywords also gets a one-pass check over the payload's bytes
// that takes valid payloads in a few microseconds without allocating and
// hands every other payload to the library (Contract.OnePass says which
// path a contract takes; outbox contract list prints it). See
// docs/contracts.md.
package contract
