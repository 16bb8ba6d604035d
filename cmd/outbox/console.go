package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/console"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relayd"
)

// defaultUsersFile is where the console's users are kept when neither
// --users nor OUTBOX_CONSOLE_USERS says.
const defaultUsersFile = "console-users.json"

func usersFile(flag string) string {
	if flag != "" {
		return flag
	}
	if env := os.Getenv("OUTBOX_CONSOLE_USERS"); env != "" {
		return env
	}
	return defaultUsersFile
}

func newConsole() *cobra.Command {
	var f dbFlags
	var addr, users, tlsCert, tlsKey, logLevel, inboxTable string
	var dev, proxyTLS bool
	var masks maskFlags
	var requestTTL time.Duration
	var rf routeFlags
	var replayBatch int
	var takeover time.Duration
	var of oidcFlags
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the operations console: web pages and a JSON API over the outbox, for users with roles (docs/console.md)",
		Long: `Serve the operations console: the overview, the dead letters (filter, detail,
retry, discard), requests that need a second person (replay of kept published
events, repair of a dead letter: an operator requests, another user with the
approver role approves, the console carries it out) and the audit, as web
pages and as a JSON API under /api/v1.

It refuses to start without users: add them with 'outbox console user add',
or sign people in through an OpenID Connect provider (--oidc-issuer and the
other --oidc flags; the users file then serves break-glass passwords and API
tokens). It re-reads the users file on SIGHUP. --dev runs it without users
on the loopback only, everyone signed in as an operator. A non-loopback
address needs --tls-cert and --tls-key, or --proxy-tls when a reverse proxy
in front terminates TLS.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			if (tlsCert == "") != (tlsKey == "") {
				return errors.New("--tls-cert and --tls-key go together")
			}
			path := usersFile(users)
			u, err := console.LoadUsers(path)
			if err != nil {
				return err
			}
			oidcOn, err := of.check(cmd, dev)
			if err != nil {
				return err
			}
			switch {
			case dev && len(u.Users) > 0:
				return fmt.Errorf("--dev signs everyone in without a password, so it does not take users: %s has %d; drop --dev, or point --users at a file with none", path, len(u.Users))
			case len(u.Users) == 0 && !dev && !oidcOn:
				return fmt.Errorf("no console users in %s, so nobody could sign in: add one with `outbox console user add NAME --role viewer|operator|approver --users %s`, sign in through OpenID Connect with --oidc-issuer, or try it with --dev on the loopback", path, path)
			}
			loopback := console.LoopbackAddr(addr)
			switch {
			case dev && !loopback:
				return fmt.Errorf("--dev listens on the loopback only; --addr %s is not (use 127.0.0.1:PORT or localhost:PORT)", addr)
			case !loopback && tlsCert == "" && !proxyTLS:
				return fmt.Errorf("--addr %s is reachable from other machines: serve HTTPS with --tls-cert and --tls-key, or put a TLS-terminating reverse proxy in front and pass --proxy-tls", addr)
			}
			if err := intIn("replay-batch", replayBatch, 1, 100_000); err != nil {
				return err
			}
			if takeover < time.Second {
				return fmt.Errorf("--takeover-after %s: use at least 1s (a live executor renews its heartbeat after every batch)", takeover)
			}
			rc, err := rf.config(cmd)
			if err != nil {
				return err
			}
			var oidc *console.OIDC
			if oidcOn {
				if oidc, err = of.provider(cmd.Context(), addr, tlsCert != "" || proxyTLS); err != nil {
					return err
				}
			}
			ocfg := &ops.Config{Logger: log, RequestTTL: requestTTL, Route: &rc}
			if err := masks.apply(ocfg); err != nil {
				return err
			}
			if inboxTable != "" {
				if err := outboxdriver.ValidateIdent("--inbox-table", inboxTable); err != nil {
					return err
				}
			}
			return f.withOpsDB(cmd, 8, ocfg, func(ctx context.Context, o *ops.Ops, db *relayd.DB) error {
				st := db.Store
				t := o.Table()
				status, err := st.Status(ctx, t)
				if err != nil {
					return err
				}
				if status.SchemaVersion < status.LatestSchemaVersion {
					return fmt.Errorf("%s is at schema version %d; the console needs %d: run `outbox migrate`", t, status.SchemaVersion, status.LatestSchemaVersion)
				}
				var ibx *ops.Inbox
				if inboxTable != "" {
					adm, err := inboxAdmin(db)
					if err != nil {
						return err
					}
					if ibx, err = ops.NewInbox(o, adm, outboxdriver.Table{Schema: t.Schema, Name: inboxTable}); err != nil {
						return err
					}
				}
				srv, err := console.New(o, &console.Config{Users: u, OIDC: oidc, Dev: dev, SecureCookies: tlsCert != "" || proxyTLS, Logger: log, Inbox: ibx})
				if err != nil {
					return err
				}
				// SIGHUP would end the process: take it before serving.
				hup := make(chan os.Signal, 1)
				signal.Notify(hup, syscall.SIGHUP)
				defer signal.Stop(hup)
				rctx, stopReloads := context.WithCancel(ctx)
				defer stopReloads()
				go reloadUsers(rctx, hup, srv, path, oidcOn, log)
				sctx, stopSampling := context.WithCancel(ctx)
				defer stopSampling()
				go srv.Sample(sctx) // the overview's chart
				// Carries out approved replays and repairs, and resumes those
				// a console that stopped left executing.
				exec, err := o.NewExecutor(&ops.ExecutorConfig{BatchSize: replayBatch, Stale: takeover, Logger: log})
				if err != nil {
					return err
				}
				if err := exec.Start(ctx); err != nil {
					return err
				}
				defer func() {
					sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
					defer cancel()
					_ = exec.Stop(sctx)
				}()
				return serveConsole(ctx, cmd.ErrOrStderr(), srv, addr, tlsCert, tlsKey, dev && len(u.Users) == 0, t)
			})
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on (host:port)")
	fl.StringVar(&users, "users", "", "users file (default "+defaultUsersFile+", or OUTBOX_CONSOLE_USERS)")
	fl.StringVar(&tlsCert, "tls-cert", "", "serve HTTPS with this certificate (PEM)")
	fl.StringVar(&tlsKey, "tls-key", "", "the certificate's private key (PEM)")
	fl.BoolVar(&proxyTLS, "proxy-tls", false, "a reverse proxy in front terminates TLS: mark cookies Secure and allow a non-loopback --addr without --tls-cert")
	fl.BoolVar(&dev, "dev", false, "development: start without users (everyone is the operator \"dev\"), loopback only; refuses users and --oidc-issuer")
	masks.register(cmd)
	fl.StringVar(&inboxTable, "inbox-table", "", "an inbox table in --schema whose consumers' dead letters the Consumers page shows (default: none)")
	fl.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fl.DurationVar(&requestTTL, "request-ttl", ops.DefaultRequestTTL, "how long a replay or repair request may wait to be approved and carried out before it expires")
	fl.IntVar(&replayBatch, "replay-batch", ops.DefaultReplayBatchSize, "events a replay re-enqueues per transaction")
	fl.DurationVar(&takeover, "takeover-after", ops.DefaultExecutorStale, "take over a request being carried out whose executor (a console that stopped or crashed) has not renewed its heartbeat for this long, and resume it from its cursor")
	rf.register(cmd) // as the relay routes: a replay's destination filter follows it
	of.register(cmd)
	cmd.AddCommand(newConsoleUser())
	return cmd
}

// reloadUsers re-reads the users file at every signal on hup until ctx
// ends. A file that does not load leaves the users as they were.
func reloadUsers(ctx context.Context, hup <-chan os.Signal, srv *console.Server, path string, oidc bool, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		u, err := console.LoadUsers(path)
		if err == nil {
			err = srv.SetUsers(u)
		}
		if err != nil {
			log.Error("console: users file not reloaded; the users stay as they were", "file", path, "err", err)
			continue
		}
		log.Info("console: users file reloaded", "file", path, "users", len(u.Users))
		if len(u.Users) == 0 && !oidc {
			log.Warn("console: the users file has no users and there is no OpenID Connect: nobody can sign in", "file", path)
		}
	}
}

// serveConsole listens on addr and serves srv until ctx ends.
func serveConsole(ctx context.Context, stderr io.Writer, srv *console.Server, addr, cert, key string, devNoUsers bool, t outboxdriver.Table) error {
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12},
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	scheme := "http"
	if cert != "" {
		scheme = "https"
	}
	if devNoUsers {
		fmt.Fprintln(stderr, strings.Repeat("!", 72))
		fmt.Fprintln(stderr, "!! DEV MODE: no users; every browser on this machine is signed in as")
		fmt.Fprintln(stderr, "!! \"dev\" with the operator role. Loopback only. Not for production.")
		fmt.Fprintln(stderr, strings.Repeat("!", 72))
	}
	fmt.Fprintf(stderr, "outbox console for %s on %s://%s\n", t, scheme, ln.Addr())
	done := make(chan error, 1)
	go func() {
		if cert != "" {
			done <- hs.ServeTLS(ln, cert, key)
		} else {
			done <- hs.Serve(ln)
		}
	}()
	select {
	case err := <-done:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = hs.Shutdown(sctx)
	if serveErr := <-done; !errors.Is(serveErr, http.ErrServerClosed) && err == nil {
		err = serveErr
	}
	return err
}

func newConsoleUser() *cobra.Command {
	cmd := &cobra.Command{Use: "user", Short: "Add, list or remove the console's users"}
	var users string
	cmd.PersistentFlags().StringVar(&users, "users", "", "users file (default "+defaultUsersFile+", or OUTBOX_CONSOLE_USERS)")

	var role string
	var fromStdin bool
	add := &cobra.Command{
		Use:   "add NAME --role viewer|operator|approver",
		Short: "Add a user; print their password (unless --password-stdin) and API token once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := ops.ParseRole(role)
			if err != nil {
				return fmt.Errorf("--role: %w", err)
			}
			path := usersFile(users)
			u, err := console.LoadUsers(path)
			if err != nil {
				return err
			}
			password, generated := console.NewPassword(), true
			if fromStdin {
				line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if err != nil && !errors.Is(err, io.EOF) {
					return fmt.Errorf("--password-stdin: %w", err)
				}
				password, generated = strings.TrimRight(line, "\r\n"), false
			}
			token, err := u.Add(args[0], r, password)
			if err != nil {
				return err
			}
			if err := u.Save(path); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "added %s (%s) to %s\n", args[0], r, path)
			if generated {
				fmt.Fprintf(out, "password:  %s\n", password)
			}
			fmt.Fprintf(out, "API token: %s\n", token)
			fmt.Fprintln(out, "They are shown this once; the file keeps only their hashes. A running console reads the file again on SIGHUP.")
			return nil
		},
	}
	add.Flags().StringVar(&role, "role", "", "viewer (reads), operator (reads, retries, discards) or approver (reads, approves others' requests)")
	add.Flags().BoolVar(&fromStdin, "password-stdin", false, "read the password from the first line of standard input instead of generating one")
	_ = add.MarkFlagRequired("role")

	list := &cobra.Command{
		Use:   "list",
		Short: "List the users and their roles",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			u, err := console.LoadUsers(usersFile(users))
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tROLE\tCREATED")
			for _, x := range u.Users {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", x.Name, x.Role, x.Created.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	remove := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a user (a running console drops them on SIGHUP)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := usersFile(users)
			u, err := console.LoadUsers(path)
			if err != nil {
				return err
			}
			if err := u.Remove(args[0]); err != nil {
				return err
			}
			if err := u.Save(path); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s from %s\n", args[0], path)
			return nil
		},
	}
	cmd.AddCommand(add, list, remove)
	return cmd
}
