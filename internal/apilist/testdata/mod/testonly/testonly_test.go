package testonly

import "testing"

func TestNothing(t *testing.T) {}
