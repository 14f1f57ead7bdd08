package mysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"log"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/mysql"
)

func exampleDSN() string {
	if v := os.Getenv("ONCEMILL_MARIADB_DSN"); v != "" {
		return v
	}
	return "root@tcp(127.0.0.1:3306)/test"
}

// The one-transaction mode over MariaDB: the key is claimed by the first
// statement of the handler's transaction, the handler writes through that
// transaction, and the success commits with its writes.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", exampleDSN())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	st, err := mysql.New(db, mysql.Options{Table: "oncemill_example_records"})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil { // idempotent; safe from every worker at once
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS oncemill_example_payments (message_uuid VARCHAR(64) PRIMARY KEY, amount INT)`); err != nil {
		log.Fatal(err)
	}

	r, err := receiver.NewTransactional(st).
		WithEventHandler(func(e pipeline.Event) { fmt.Println("outcome:", e.Outcome) }).
		Build()
	if err != nil {
		log.Fatal(err)
	}
	handler := r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := mysql.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO oncemill_example_payments VALUES (?, 100)`, msg.UUID)
		return nil, err // nil commits the payment and the record together
	})

	msg := message.NewMessage("payment-"+rand.Text(), []byte(`{"amount":100}`))
	for range 2 { // the broker delivers it twice
		if _, err := handler(msg); err != nil {
			log.Fatal(err)
		}
	}
	var rows int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM oncemill_example_payments WHERE message_uuid = ?`, msg.UUID).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payment rows:", rows)

	// Output:
	// outcome: executed
	// outcome: replayed
	// payment rows: 1
}
