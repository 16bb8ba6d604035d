package webhookconsumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/webhookconsumer"
)

// A billing service receives the order events the relay's webhooksink
// posts to https://billing.example.com/hooks/${destination}, and creates
// one invoice per order however often it is sent.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://billing@db/billing")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	hooks, err := webhookconsumer.New(ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var ev struct {
			OrderID int64 `json:"orderId"`
		}
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return consumer.Permanent(err) // dead-lettered, answered 422
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, ev.OrderID)
		return err // nil: 204 after the commit; an error: 500, the relay sends it again
	}, &webhookconsumer.Config{Secrets: []string{os.Getenv("WEBHOOK_SECRET")}})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /hooks/", hooks)
	srv := &http.Server{Addr: ":8080", Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx) // the requests in hand finish, commit and answer
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
