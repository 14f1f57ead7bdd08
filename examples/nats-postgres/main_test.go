package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/oncemill/oncemill/examples/internal/exampletest"
)

// TestNATSPostgres runs the program in process against the machine's NATS
// (JetStream) and PostgreSQL, publishes its demo orders (three, one of
// them twice, and one that can never be booked), and checks one row per
// order and none for the bad one.
func TestNATSPostgres(t *testing.T) {
	pool, schema := exampletest.Postgres(t)
	cfg := config{
		NATSURL:     exampletest.NATSURL,
		Stream:      exampletest.Name("oncemill_example_orders_"),
		Durable:     "book-orders",
		DatabaseURL: exampletest.PostgresDSN,
		Schema:      schema,
	}
	exampletest.NATS(t, cfg.Stream)

	// The test publishes before the program starts: the stream first, as
	// the program would create it.
	nc, err := nats.Connect(cfg.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := ensureStream(js, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	pub, err := wnats.NewPublisher(wnats.PublisherConfig{URL: cfg.NATSURL}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs := demoOrders()
	if err := pub.Publish(cfg.Stream, msgs...); err != nil {
		t.Fatal(err)
	}
	books, bad := msgs[0], msgs[4]
	if msgs[1] != books {
		t.Fatal("demoOrders changed: the test expects the books order twice first, and the bad one last")
	}

	log := &exampletest.Log{}
	prog := exampletest.Start(t, log, func(ctx context.Context) error {
		return run(ctx, cfg, slog.New(slog.NewTextHandler(log, nil)))
	})
	exampletest.Eventually(t, 60*time.Second, log, "3 orders executed, 1 replayed and 1 failure cached", func() (bool, error) {
		return log.Count("outcome=executed") == 3 && log.Count("outcome=replayed") == 1 &&
			log.Count("outcome=cached_failure\n") == 1, prog.Exited()
	})
	if n := log.Count("outcome=replayed", "uuid="+books.UUID); n != 1 {
		exampletest.Fatalf(t, log, "the duplicate books order replayed %d times, want 1", n)
	}
	if n := log.Count("outcome=cached_failure\n", "uuid="+bad.UUID); n != 1 {
		exampletest.Fatalf(t, log, "the bad order's failure cached %d times, want 1", n)
	}
	exampletest.ExactlyOnce(t, exampletest.CountRows(t, pool, pgx.Identifier{schema, "orders"}.Sanitize()),
		books.UUID, msgs[2].UUID, msgs[3].UUID)

	prog.Stop()

	// The durable consumer outlives the program, with its position: all
	// five acked, none pending.
	info, err := js.ConsumerInfo(cfg.Stream, cfg.Durable)
	if err != nil {
		t.Fatalf("the durable consumer after the program stopped: %v", err)
	}
	if info.AckFloor.Stream != 5 || info.NumAckPending != 0 || info.NumPending != 0 {
		t.Errorf("consumer at ack floor %d, %d pending acks, %d pending; want 5, 0, 0", info.AckFloor.Stream, info.NumAckPending, info.NumPending)
	}
}
