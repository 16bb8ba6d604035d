package outboxpgx

import "github.com/outboxkit/outbox/outboxdriver"

// SetRelayLatest makes src, a Source of this driver, record and check the
// table against schema version v as the newest its code knows: the code
// path of a relay of the release before, which knew one version less.
func SetRelayLatest(src outboxdriver.Source, v int) { src.(*source).latest = v }
