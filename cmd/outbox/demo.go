package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/cmd/outbox/internal/demo"
)

func newDemo() *cobra.Command {
	var cfg demo.Config
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole outbox story end to end and report what was lost (nothing)",
		Long: `Run the outbox pattern end to end with nothing installed: an orders service
writes orders and their events in transactions (about one in eight rolled back
on purpose), a relay process publishes them to NATS JetStream, and a billing
consumer applies each event once through the inbox. Midway the relay is
SIGKILLed and restarted, and duplicates are injected on the broker. The run
ends with a report: events committed, published, consumed, duplicates
suppressed, lost, phantoms, double effects, order violations and
commit-to-consumer latency. It exits with status 1 if anything was lost,
invented, applied twice or reordered.

With no flags it uses a SQLite file in a temporary directory and an embedded
NATS server. --db postgres://... or mysql://... and --sink nats://host:port
run the same story on real services (in tables of its own, dropped at the
end). --serve keeps the relay running afterwards, with its metrics on
--metrics-addr, so that /metrics and outbox status can be tried against it.`,
		Example: `  outbox demo
  outbox demo --orders 2000
  outbox demo --db postgres://postgres@127.0.0.1:5432/test --sink nats://127.0.0.1:4222
  outbox demo --serve --metrics-addr 127.0.0.1:9464`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := firstError(
				intIn("orders", cfg.Orders, 1, 1_000_000),
				intIn("writers", cfg.Writers, 1, 64),
				intIn("rate", cfg.Rate, 1, 100_000),
			); err != nil {
				return err
			}
			if cfg.MetricsAddr != "" && !cfg.Serve {
				return errors.New("--metrics-addr needs --serve")
			}
			if cfg.Serve && cfg.MetricsAddr == "" {
				cfg.MetricsAddr = "127.0.0.1:9464"
			}
			cfg.Out = cmd.OutOrStdout()
			if f, ok := cfg.Out.(*os.File); ok {
				if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
					cfg.Live = true // a terminal: redraw the status line in place
				}
			}
			if cfg.Serve {
				cfg.OnReport = func(rep *demo.Report) {
					rep.Print(cfg.Out)
					fmt.Fprintf(cfg.Out, "\nthe relay keeps running: metrics at http://%s/metrics; try\n  outbox status --db %s --schema %s --table %s\nCtrl-C to stop (the demo's tables and files are removed then).\n",
						cfg.MetricsAddr, rep.DBURL, rep.Schema, rep.TableName)
				}
			}
			rep, err := demo.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if !cfg.Serve {
				rep.Print(cfg.Out)
			}
			if !rep.OK() {
				return errors.New("demo: the report shows a violation")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&cfg.DB, "db", "", "database: postgres://user@host:5432/db, mysql://user:pass@host:3306/db or sqlite://path (default: a SQLite file in a temporary directory)")
	cmd.Flags().StringVar(&cfg.Sink, "sink", "", "NATS server with JetStream, nats://host:port (default: an embedded server)")
	cmd.Flags().IntVar(&cfg.Orders, "orders", 200, "orders to place (three events each)")
	cmd.Flags().IntVar(&cfg.Writers, "writers", 4, "orders written at once")
	cmd.Flags().IntVar(&cfg.Rate, "rate", 300, "most transactions per second, all writers together")
	cmd.Flags().BoolVar(&cfg.Serve, "serve", false, "keep the relay running after the report, with metrics, until Ctrl-C")
	cmd.Flags().StringVar(&cfg.MetricsAddr, "metrics-addr", "", "with --serve: where the relay serves /metrics (default 127.0.0.1:9464)")
	return cmd
}
