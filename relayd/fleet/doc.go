// Package fleet relays several outbox tables (sources) from one process,
// each through a relay as relayd.Open makes it, with the sinks opened from
// their URLs (package sink/sinkurl) and shared between the sources that
// name the same one, and every source's publishes shared fairly through a
// Budget; Fleet.Reload changes the set of sources while it runs (`outbox
// relay --config`; docs/operations.md, One relay for many databases).
package fleet
