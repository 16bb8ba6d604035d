package pkg

// See docs/a.md#notes and docs/a.md#gone.
