package relay

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// Every field out of its range fails New with a *ConfigError naming that
// field, its value and its range, found by errors.As also when wrapped;
// the bounds themselves are accepted.
func TestNewNamesTheFieldOutOfRange(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		field    string
		bad, ok  func(*Config)
		value    any
		min, max any
		text     string
	}{
		{"BatchSize", func(c *Config) { c.BatchSize = -1 }, func(c *Config) { c.BatchSize = 1 }, -1, 1, 100_000, "relay: Config.BatchSize -1: use 1 to 100000"},
		{"BatchSize", func(c *Config) { c.BatchSize = 100_001 }, func(c *Config) { c.BatchSize = 100_000 }, 100_001, 1, 100_000, ""},
		{"Lanes", func(c *Config) { c.Lanes = 65 }, func(c *Config) { c.Lanes = 64 }, 65, 1, 64, "relay: Config.Lanes 65: use 1 to 64"},
		{"Lanes", func(c *Config) { c.Lanes = -1 }, func(c *Config) { c.Lanes = 1 }, -1, 1, 64, ""},
		{"Linger", func(c *Config) { c.Linger = -time.Millisecond }, func(c *Config) { c.Linger = 0 }, -time.Millisecond, time.Duration(0), time.Second, "relay: Config.Linger -1ms: use 0s to 1s"},
		{"Linger", func(c *Config) { c.Linger = 2 * time.Second }, func(c *Config) { c.Linger = time.Second }, 2 * time.Second, time.Duration(0), time.Second, ""},
		{"PollInterval", func(c *Config) { c.PollInterval = time.Microsecond }, func(c *Config) { c.PollInterval = time.Millisecond }, time.Microsecond, time.Millisecond, nil, "relay: Config.PollInterval 1µs: use at least 1ms"},
		{"LeaseTTL", func(c *Config) { c.LeaseTTL = 299 * time.Millisecond }, func(c *Config) { c.LeaseTTL = 300 * time.Millisecond }, 299 * time.Millisecond, 300 * time.Millisecond, nil, ""},
		{"RetryBase", func(c *Config) { c.RetryBase = -time.Second }, func(c *Config) { c.RetryBase = time.Millisecond }, -time.Second, time.Millisecond, nil, ""},
		{"RetryBase", func(c *Config) { c.RetryBase = time.Microsecond }, func(c *Config) { c.RetryBase = time.Millisecond }, time.Microsecond, time.Millisecond, nil, ""},
		{"RetryMax", func(c *Config) { c.RetryBase, c.RetryMax = time.Second, time.Millisecond }, func(c *Config) { c.RetryBase, c.RetryMax = time.Second, time.Second }, time.Millisecond, time.Second, nil, "relay: Config.RetryMax 1ms: use at least RetryBase (1s)"},
		{"MaxAttempts", func(c *Config) { c.MaxAttempts = -1 }, func(c *Config) { c.MaxAttempts = 1 }, -1, 1, nil, ""},
		{"Poison", func(c *Config) { c.Poison = 2 }, func(c *Config) { c.Poison = Continue }, Policy(2), Hold, Continue, "relay: Config.Poison 2: use Hold or Continue"},
		{"CleanupAfter", func(c *Config) { c.CleanupAfter = -time.Second }, func(c *Config) { c.CleanupAfter = 0 }, -time.Second, time.Duration(0), nil, "relay: Config.CleanupAfter -1s: must not be negative"},
		{"CleanupBatch", func(c *Config) { c.CleanupBatch = -1 }, func(c *Config) { c.CleanupBatch = 1 }, -1, 1, nil, ""},
		{"PartitionsEvery", func(c *Config) { c.PartitionsEvery = 9 * time.Millisecond }, func(c *Config) { c.PartitionsEvery = 10 * time.Millisecond }, 9 * time.Millisecond, 10 * time.Millisecond, nil, ""},
		{"PartitionLockTimeout", func(c *Config) { c.PartitionLockTimeout = time.Microsecond }, func(c *Config) { c.PartitionLockTimeout = time.Millisecond }, time.Microsecond, time.Millisecond, time.Minute, ""},
		{"PartitionLockTimeout", func(c *Config) { c.PartitionLockTimeout = time.Minute + 1 }, func(c *Config) { c.PartitionLockTimeout = time.Minute }, time.Minute + 1, time.Millisecond, time.Minute, ""},
		{"FinishTimeout", func(c *Config) { c.FinishTimeout = -time.Second }, func(c *Config) { c.FinishTimeout = time.Millisecond }, -time.Second, time.Millisecond, nil, ""},
	} {
		t.Run(fmt.Sprint(c.field, " ", c.value), func(t *testing.T) {
			t.Parallel()
			var cfg Config
			c.bad(&cfg)
			_, err := New(&fakeSource{}, &fakeSink{}, &cfg)
			var ce *ConfigError
			if !errors.As(fmt.Errorf("starting: %w", err), &ce) {
				t.Fatalf("New: %v, want a *ConfigError", err)
			}
			if ce.Field != c.field || ce.Value != c.value || ce.Min != c.min || ce.Max != c.max {
				t.Fatalf("New: %#v, want field %s, value %v, range %v to %v", ce, c.field, c.value, c.min, c.max)
			}
			if c.text != "" && err.Error() != c.text {
				t.Fatalf("New: %q, want %q", err, c.text)
			}
			cfg = Config{}
			c.ok(&cfg)
			if _, err := New(&fakeSource{}, &fakeSink{}, &cfg); err != nil {
				t.Fatalf("New at the bound: %v", err)
			}
		})
	}
}

// Validate checks the values as they stand, zeros included, while New
// fills the defaults first; the defaults pass.
func TestValidateTakesZeroAsGiven(t *testing.T) {
	t.Parallel()
	if err := (Config{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	cfg := Config{}.WithDefaults()
	cfg.Lanes = 0
	var ce *ConfigError
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "Lanes" || ce.Value != 0 {
		t.Fatalf("Validate with Lanes 0: %v, want a *ConfigError for Lanes", err)
	}
	r, err := New(&fakeSource{}, &fakeSink{}, &Config{Lanes: 0})
	if err != nil {
		t.Fatalf("New with Lanes 0: %v", err)
	}
	if r.cfg.Lanes != DefaultLanes {
		t.Fatalf("New with Lanes 0 runs %d lanes, want the default %d", r.cfg.Lanes, DefaultLanes)
	}
}
