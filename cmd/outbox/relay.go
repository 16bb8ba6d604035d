package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/outboxdriver"
	binlog "github.com/outboxkit/outbox/outboxmysql/cdc"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/sinkurl"
)

func newRelay() *cobra.Command {
	var (
		f           dbFlags
		sf          sinkFlags
		rf          routeFlags
		batch       int
		poll        time.Duration
		grace       time.Duration
		metricsAddr string
		retention   string
		logLevel    string
		poison      string
		// The relay's defaults for the fields no flag sets: a flag's
		// value is used as given, zero included (docs/cli.md).
		rcfg       = relay.Config{}.WithDefaults()
		source     string
		cdcCfg     cdc.Config
		cdcCreate  bool
		cdcMode    string
		binlogCfg  binlog.Config
		binlogMode string
		contracts  contractFlags
		ce         cloudEventsFlags
		rec        relayReconcile
		fl         fleetFlags
	)
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed outbox events to a broker until SIGINT/SIGTERM",
		Long: `Claim committed, unpublished events in insertion order, publish them to the
sink and record them as published once the broker acknowledged. Woken by
LISTEN/NOTIFY when idle, with --poll-interval as the safety net. On SIGINT or
SIGTERM it stops claiming, finishes the batch in flight and exits.

While batches come back short the relay runs on one P (GOMAXPROCS=1: less
CPU for a chain of round trips); from the first full batch (a backlog) on
every CPU the runtime would use, until batches have been short for a second.
GOMAXPROCS in the environment turns this off.

--source cdc tails PostgreSQL's WAL instead (logical replication, pgoutput):
no claim queries, commit order, and events written as logical decoding
messages (no table rows). It needs wal_level = logical and a role with
REPLICATION; it creates its publication and replication slot when they are
missing (--cdc-create=false: an error instead). One relay streams a slot at
a time; others wait as standbys and take over within about two --lease-ttl.
See docs/cdc.md.

--source binlog tails the MySQL/MariaDB binary log instead: the relay
registers as a replica and publishes the outbox table's inserted rows in
commit order. It needs log_bin, binlog_format=ROW, binlog_row_image=FULL and
an account with REPLICATION SLAVE and REPLICATION CLIENT (BINLOG MONITOR on
MariaDB); one relay streams the table at a time, standbys take over. See
docs/binlog.md.

Several outbox tables from one process: repeat --db, or list the sources
(database, schema, table, weight, sink and routing) in a YAML file with
--config; SIGHUP reloads the file, stopping removed sources (their leases
released) and starting added ones; a file that does not check is refused
and the running sources kept. Each source is relayed as a single --db is,
with its own leases, breaker and metrics (label source); their publishes
share one budget (--publish-turns of --publish-quantum messages), handed
out in weighted round robin so that a flooded source cannot hold up the
others. /readyz lists every source (?source=NAME checks one). See
docs/operations.md, One relay for many databases.

With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set,
it exports an OpenTelemetry span per published event over OTLP
(http/protobuf, or grpc per OTEL_EXPORTER_OTLP_PROTOCOL), honouring the
standard OTEL_* variables (sampler, batching, resource, headers), and
flushes them at exit. See docs/tracing.md.

Sinks (--sink):
  nats://host:port            NATS JetStream; stream OUTBOX on outbox.event.> is
                              created if missing (--nats-no-create-stream)
  kafka://host:port[,...]     Kafka; acks=all, idempotent producer
  amqp://user:pass@host/vhost RabbitMQ; publisher confirms, mandatory
                              (--amqp-exchange, --amqp-declare)
  redis://host:port/db        Redis Streams (--redis-maxlen)
  mqtt://host:port            MQTT 3.1.1, QoS 1 or 2 (--mqtt-qos)
  pubsub://project[/topic]    Google Pub/Sub; ordering key = aggregate id; topic
                              = destination unless given (--pubsub-create-topics)
  kinesis://stream?region=r   Amazon Kinesis; partition key = aggregate id;
                              &endpoint=URL overrides the endpoint
  sqs://queue?region=r        Amazon SQS; .fifo queues: group = aggregate id,
                              dedupe id = event id (&endpoint=URL, &owner=ACCOUNT)
  sns://topic?region=r        Amazon SNS; .fifo topics as SQS; topic ARNs from
                              &account=ACCOUNT or STS (&endpoint=URL)
  https://host/path/${destination}
                              signed webhooks, Standard Webhooks
                              (--webhook-secret)
  stdout:                     one JSON line per event`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			fleet, err := fl.mode(cmd, &f)
			if err != nil {
				return err
			}
			t, err := f.tableName()
			if err != nil {
				return err
			}
			ret, err := parseRetention(retention)
			if err != nil {
				return err
			}
			rc, err := rf.config(cmd)
			if err != nil {
				return err
			}
			registry, err := contracts.load()
			if err != nil {
				return err
			}
			if !fleet {
				// A fleet's sources each get their own (fleet.go).
				if rc.CloudEvents, err = ce.config(&sf, t, registry); err != nil {
					return err
				}
			}
			router, err := route.New(&rc)
			if err != nil {
				return fmt.Errorf("routing: %w", err)
			}
			rcfg.BatchSize, rcfg.PollInterval = batch, poll
			// The relay's own check of its settings, before anything is
			// opened; its errors name the flag.
			if err := relayConfigFlags().check(rcfg); err != nil {
				return err
			}
			if err := firstError(
				durationIn("shutdown-grace", grace, 0, 0),
				durationIn("webhook-timeout", sf.webhookTimeout, time.Millisecond, 0),
			); err != nil {
				return err
			}
			if sf.redisMaxLen < 0 {
				return fmt.Errorf("--redis-maxlen %d: must not be negative (0 never trims)", sf.redisMaxLen)
			}
			if rcfg.Poison, err = relay.ParsePolicy(poison); err != nil {
				return fmt.Errorf("--poison-policy: %w", err)
			}
			onStage, err := faultFromEnv()
			if err != nil {
				return err
			}
			var ln net.Listener
			if metricsAddr != "" {
				// Bind before connecting anywhere, so a taken port fails fast.
				if ln, err = net.Listen("tcp", metricsAddr); err != nil {
					return fmt.Errorf("--metrics-addr %s: %v", metricsAddr, err)
				}
				defer ln.Close()
			}
			ctx := cmd.Context()
			sinkOpts, err := sf.options()
			if err != nil {
				return err
			}
			if registry != nil {
				rcfg.Contracts = registry
			}
			rcfg.Router, rcfg.Logger, rcfg.OnStage = router, log, onStage
			tp, shutdownTracing, err := tracerFromEnv(ctx, log)
			if err != nil {
				return err
			}
			defer func() {
				// Flush the spans still queued; a collector that is gone
				// costs at most a few seconds here.
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				if err := shutdownTracing(sctx); err != nil {
					log.Warn("tracing: flushing spans at exit failed", "err", err)
				}
			}()
			if tp != nil {
				rcfg.TracerProvider = tp
			}
			opts := &relayd.Options{Schema: t.Schema, Table: t.Name, Retention: ret, Relay: rcfg, OneCPUWhileIdle: true}
			if opts.Source, opts.CDC, err = cdcOptions(cmd, source, cdcCfg, cdcCreate, cdcMode); err != nil {
				return err
			}
			if opts.Binlog, err = binlogOptions(cmd, source, binlogCfg, binlogMode); err != nil {
				return err
			}
			if fleet {
				return fl.run(ctx, cmd, fleetRun{
					table: t, route: rc, sinks: &sf, sinkOptions: sinkOpts, ce: &ce, contracts: registry, template: *opts,
					ln: ln, grace: grace, log: log,
				})
			}
			dbURL, err := f.dbURL()
			if err != nil {
				return err
			}
			sinkURL, err := sf.sinkURL()
			if err != nil {
				return err
			}
			var reg *prometheus.Registry
			if ln != nil {
				reg = prometheus.NewRegistry()
				reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
				opts.Registerer = reg
			}
			var recReg prometheus.Registerer
			if reg != nil {
				recReg = reg
			}
			waitReconcile, err := rec.start(ctx, cmd, dbURL, t, recReg, log)
			if err != nil {
				return err
			}
			defer waitReconcile()
			snk, err := sinkurl.Open(ctx, sinkURL, &sinkOpts, log)
			if err != nil {
				return err
			}
			rl, err := relayd.Open(ctx, dbURL, snk, opts)
			if err != nil {
				return err
			}
			if ln != nil {
				srv := serveMetrics(ln, reg, log, rl.Ready)
				defer srv.Close()
			}
			log.Info("relay starting", "table", rl.Table().String(), "sink", redact(sinkURL), "batch", batch, "poll_interval", poll, "relay", rl.RelayName())
			return rl.Run(ctx, grace)
		},
	}
	fl.register(cmd, &f)
	cmd.Flags().StringVar(&sf.url, "sink", "", "broker URL: "+sinkSchemes+" (or OUTBOX_SINK)")
	cmd.Flags().IntVar(&batch, "batch", 500, "most events claimed and published at once")
	cmd.Flags().DurationVar(&rcfg.Linger, "linger", 0, "while traffic is light, wait this long between claims so events gather into fuller batches (less CPU, up to this much more latency)")
	cmd.Flags().IntVar(&rcfg.Lanes, "lanes", relay.DefaultLanes, "batches kept in flight at once while working off a backlog (1 turns pipelining off)")
	cmd.Flags().DurationVar(&poll, "poll-interval", 500*time.Millisecond, "longest wait for a wake-up before looking again")
	cmd.Flags().StringVar(&source, "source", relayd.SourcePoll, "how committed events are found: poll (claim rows), cdc (tail PostgreSQL's WAL; docs/cdc.md) or binlog (tail the MySQL/MariaDB binary log; docs/binlog.md)")
	cmd.Flags().StringVar(&binlogMode, "binlog-mode", "table", "with --source binlog: how writers write events, table (rows) or insert-delete (rows deleted again in the same transaction); decides what a purged position means")
	cmd.Flags().Uint32Var(&binlogCfg.ServerID, "binlog-server-id", 0, "with --source binlog: the server id the relay registers as a replica with (default: derived from the table)")
	cmd.Flags().StringVar(&cdcCfg.Slot, "cdc-slot", "", "with --source cdc: replication slot (default outbox_<schema>_<table>)")
	cmd.Flags().StringVar(&cdcCfg.Publication, "cdc-publication", "", "with --source cdc: publication of the table's inserts (default: the slot's name)")
	cmd.Flags().BoolVar(&cdcCreate, "cdc-create", true, "with --source cdc: create the publication and the slot when missing")
	cmd.Flags().StringVar(&cdcMode, "cdc-mode", "table", "with --source cdc: how writers write events, table (rows), message (logical decoding messages) or insert-delete (rows deleted again at once); decides what a lost slot means")
	cmd.Flags().DurationVar(&grace, "shutdown-grace", 30*time.Second, "on SIGTERM, how long the batch in flight may take to finish")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://HOST:PORT/metrics (off when empty)")
	cmd.Flags().StringVar(&retention, "retention", "delete", "what happens to published rows: delete, or keep (sets published_at; see --keep-for)")
	cmd.Flags().DurationVar(&rcfg.CleanupAfter, "keep-for", 24*time.Hour, "with --retention keep: delete published rows older than this, in batches; on a table partitioned by time, drop a partition whose range ended this long ago once it is fully published (0 keeps them forever)")
	cmd.Flags().DurationVar(&rcfg.PartitionLockTimeout, "partition-lock-timeout", outboxdriver.DefaultPartitionLockTimeout, "on a table partitioned by time: the longest wait for the table's lock to make or drop a partition (tried again next minute)")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().DurationVar(&rcfg.LeaseTTL, "lease-ttl", 10*time.Second, "partition lease lifetime; a dead relay's partitions move within about two TTLs")
	cmd.Flags().IntVar(&rcfg.MaxAttempts, "max-attempts", 20, "attempts before an event is dead-lettered")
	cmd.Flags().DurationVar(&rcfg.RetryBase, "retry-base", time.Second, "first retry delay of a failed event (doubles, with jitter)")
	cmd.Flags().DurationVar(&rcfg.RetryMax, "retry-max", 5*time.Minute, "longest retry delay")
	cmd.Flags().StringVar(&poison, "poison-policy", "hold", "after an event is dead-lettered, its aggregate's later events: hold (wait for an operator) or continue")
	rf.register(cmd)
	cmd.Flags().StringSliceVar(&rf.rc.HeaderColumns, "header-columns", nil, "more columns to place into headers, as column[:header] (e.g. type:eventType)")
	cmd.Flags().StringVar(&sf.natsStream, "nats-stream", "OUTBOX", "JetStream stream the events go to")
	cmd.Flags().StringSliceVar(&sf.natsSubjects, "nats-subjects", []string{"outbox.event.>"}, "subjects of the stream, when the relay creates it")
	cmd.Flags().BoolVar(&sf.natsNoCreate, "nats-no-create-stream", false, "fail instead of creating a missing stream")
	cmd.Flags().StringVar(&sf.amqpExchange, "amqp-exchange", "outbox", "RabbitMQ exchange the events go to (routing key = destination)")
	cmd.Flags().BoolVar(&sf.amqpDeclare, "amqp-declare", false, "declare the exchange (durable, topic) at start-up")
	cmd.Flags().Int64Var(&sf.redisMaxLen, "redis-maxlen", 0, "trim each Redis stream to about this many entries (0: never)")
	cmd.Flags().IntVar(&sf.mqttQoS, "mqtt-qos", 1, "MQTT QoS: 1 or 2")
	cmd.Flags().StringArrayVar(&sf.webhookSecrets, "webhook-secret", nil, "Standard Webhooks signing secret whsec_...; repeat to sign with several during rotation (or OUTBOX_WEBHOOK_SECRETS)")
	cmd.Flags().BoolVar(&sf.webhookPrivate, "webhook-allow-private", false, "allow webhook targets on loopback, private and link-local addresses")
	cmd.Flags().DurationVar(&sf.webhookTimeout, "webhook-timeout", 10*time.Second, "timeout of one webhook request")
	cmd.Flags().BoolVar(&sf.pubsubCreate, "pubsub-create-topics", false, "create a missing Pub/Sub topic on first use")
	ce.register(cmd)
	rec.register(cmd)
	contracts.register(cmd, "check every event against its contract before publishing; a violation is dead-lettered with cause contract")
	return cmd
}

// relayConfigFlags returns the flags of `outbox relay` that set
// relay.Config fields.
func relayConfigFlags() relayFlags {
	return relayFlags{
		"BatchSize":            {name: "batch", bare: true},
		"Lanes":                {name: "lanes", bare: true},
		"PollInterval":         {name: "poll-interval", bare: true},
		"Linger":               {name: "linger"},
		"LeaseTTL":             {name: "lease-ttl"},
		"RetryBase":            {name: "retry-base"},
		"RetryMax":             {name: "retry-max"},
		"MaxAttempts":          {name: "max-attempts"},
		"CleanupAfter":         {name: "keep-for"},
		"PartitionLockTimeout": {name: "partition-lock-timeout"},
	}
}

// binlogOptions checks the --binlog-* flags.
func binlogOptions(cmd *cobra.Command, source string, c binlog.Config, mode string) (binlog.Config, error) {
	if source != relayd.SourceBinlog {
		for _, name := range []string{"binlog-mode", "binlog-server-id"} {
			if cmd.Flags().Changed(name) {
				return c, fmt.Errorf("--%s goes with --source binlog", name)
			}
		}
		return c, nil
	}
	var err error
	if c.Mode, err = binlog.ParseMode(mode); err != nil {
		return c, fmt.Errorf("--binlog-mode: %w", err)
	}
	return c, nil
}

// cdcOptions checks the --source and --cdc-* flags.
func cdcOptions(cmd *cobra.Command, source string, c cdc.Config, create bool, mode string) (string, cdc.Config, error) {
	switch source {
	case relayd.SourcePoll, relayd.SourceBinlog:
		for _, name := range []string{"cdc-slot", "cdc-publication", "cdc-create", "cdc-mode"} {
			if cmd.Flags().Changed(name) {
				return "", c, fmt.Errorf("--%s goes with --source cdc", name)
			}
		}
		return source, c, nil
	case relayd.SourceCDC:
	default:
		return "", c, fmt.Errorf("--source %q: use poll, cdc or binlog", source)
	}
	var err error
	if c.Mode, err = cdc.ParseMode(mode); err != nil {
		return "", c, fmt.Errorf("--cdc-mode: %w", err)
	}
	c.NoCreate = !create
	return source, c, nil
}

func parseRetention(s string) (outboxdriver.Retention, error) {
	switch s {
	case "delete":
		return outboxdriver.RetentionDelete, nil
	case "keep":
		return outboxdriver.RetentionKeep, nil
	}
	return 0, fmt.Errorf("--retention %q: use delete or keep", s)
}

func serveMetrics(ln net.Listener, reg *prometheus.Registry, log *slog.Logger, ready func() bool) *http.Server {
	return serveHTTP(ln, reg, log,
		func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") },
		func(w http.ResponseWriter, _ *http.Request) {
			if !ready() {
				http.Error(w, "not ready: the relay has not reached the database within a lease TTL", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ready")
		})
}

// serveHTTP serves g's metrics at /metrics and the health checks on ln.
func serveHTTP(ln net.Listener, g prometheus.Gatherer, log *slog.Logger, healthz, readyz http.HandlerFunc) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", healthz)
	mux.HandleFunc("/readyz", readyz)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	return srv
}
