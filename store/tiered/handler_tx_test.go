package tiered_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/tiered"
)

// In the one-transaction mode over the tiered store, the handler finds the
// truth's transaction with postgres.TxFromContext, as over postgres.Store
// alone: its write commits with the record of the message, and a failure
// rolls both back (docs/tiered.md, Wiring).
func TestHandlerTransactionIsTheTruths(t *testing.T) {
	w := newWorld(t)
	s := w.store(t, tiered.Options{})
	ctx := context.Background()
	ledger := pgx.Identifier{w.db.schema, "ledger"}.Sanitize()
	if _, err := w.db.pool.Exec(ctx, "CREATE TABLE "+ledger+" (message_uuid text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	r, err := receiver.NewTransactional(s).WithScope("ledger").Build()
	if err != nil {
		t.Fatal(err)
	}
	fail := errors.New("declined")
	h := r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := postgres.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no transaction in the handler's context")
		}
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+ledger+" (message_uuid) VALUES ($1)", msg.UUID); err != nil {
			return nil, err
		}
		if string(msg.Payload) == "fail" {
			return nil, policy.Cached(fail)
		}
		return nil, nil
	})
	for _, m := range []*message.Message{message.NewMessage("ok", []byte("ok")), message.NewMessage("ok", []byte("ok")), message.NewMessage("bad", []byte("fail"))} {
		if _, err := h(m); err != nil {
			t.Fatalf("%s: %v", m.UUID, err)
		}
	}
	rows := map[string]int{}
	for _, id := range []string{"ok", "bad"} {
		var n int
		if err := w.db.pool.QueryRow(ctx, "SELECT count(*) FROM "+ledger+" WHERE message_uuid = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		rows[id] = n
	}
	if rows["ok"] != 1 || rows["bad"] != 0 {
		t.Fatalf("ledger rows %v: want the success's row once (its duplicate replayed) and none of the rolled-back failure", rows)
	}
	for id, want := range map[string]store.Status{"ok": store.StatusSucceeded, "bad": store.StatusCachedFailure} {
		rec, err := s.Get(ctx, "ledger", id)
		if err != nil || rec.Status != want {
			t.Fatalf("record of %s = %v, %v; want %v", id, rec.Status, err, want)
		}
	}
}
