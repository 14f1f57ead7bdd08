package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
)

func exampleDSN() string {
	if v := os.Getenv("ONCEMILL_POSTGRES_DSN"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/test"
}

// The lease mode over PostgreSQL: the record is claimed and completed by
// statements of its own, around a handler whose effects live elsewhere.
// Every worker on the same table shares the records.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleDSN())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	st, err := postgres.New(pool, postgres.Options{Schema: "oncemill_example"})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil { // idempotent; safe from every worker at once
		log.Fatal(err)
	}

	r, err := receiver.New(st).WithScope("billing").Build()
	if err != nil {
		log.Fatal(err)
	}
	charge := r.Middleware(func(m *message.Message) ([]*message.Message, error) {
		fmt.Println("charging", string(m.Payload))
		return nil, nil
	})
	uuid := "order-" + rand.Text() // a fresh key for every run of the example
	for range 2 {                  // the broker delivers it twice
		if _, err := charge(message.NewMessage(uuid, []byte("12.00 EUR"))); err != nil {
			log.Fatal(err)
		}
	}

	rec, err := st.Get(ctx, "billing", uuid)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.Status, "attempt", rec.Attempt)

	// Output:
	// charging 12.00 EUR
	// succeeded attempt 1
}

// The one-transaction mode: the key is claimed by the first statement of
// the handler's transaction, the handler writes through that transaction,
// and the success commits with its writes.
func ExampleTxFromContext() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleDSN())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	st, err := postgres.New(pool, postgres.Options{Schema: "oncemill_example"})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS oncemill_example.payments (message_uuid text PRIMARY KEY, amount int)`); err != nil {
		log.Fatal(err)
	}

	r, err := receiver.NewTransactional(st).
		WithEventHandler(func(e pipeline.Event) { fmt.Println("outcome:", e.Outcome) }).
		Build()
	if err != nil {
		log.Fatal(err)
	}
	handler := r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), `INSERT INTO oncemill_example.payments VALUES ($1, 100)`, msg.UUID)
		return nil, err // nil commits the payment and the record together
	})

	msg := message.NewMessage("payment-"+rand.Text(), []byte(`{"amount":100}`))
	for range 2 { // the broker delivers it twice
		if _, err := handler(msg); err != nil {
			log.Fatal(err)
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM oncemill_example.payments WHERE message_uuid = $1`, msg.UUID).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payment rows:", rows)

	// Output:
	// outcome: executed
	// outcome: replayed
	// payment rows: 1
}
