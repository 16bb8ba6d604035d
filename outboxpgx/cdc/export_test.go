package cdc

// SetRelayLatest makes src record with the slot's lease, and check the
// table against, schema version v as the newest its code knows: the code
// path of a relay of the release before, which knew one version less.
func SetRelayLatest(src *Source, v int) { src.latest = v }
