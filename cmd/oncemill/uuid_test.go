package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
)

// inspect --uuid finds the record of a message whose key is a hash of its
// content, which the operator holding the message (dead-lettered, say)
// cannot name: on every store, in the lease mode, and on PostgreSQL in the
// one-transaction mode too.
func TestInspectByUUID(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, fx *fixture) {
		builders := map[string]*receiver.Builder{"orders": receiver.New(fx.st)}
		if ts, ok := fx.st.(store.Transactional); ok {
			builders["orders-tx"] = receiver.NewTransactional(ts)
		}
		for scope, b := range builders {
			byContent, err := keygen.ContentHash(keygen.ContentHashOptions{})
			if err != nil {
				t.Fatal(err)
			}
			r, err := b.WithScope(scope).WithKeyGenerator(byContent).Build()
			if err != nil {
				t.Fatal(err)
			}
			h := r.Middleware(func(m *message.Message) ([]*message.Message, error) {
				if strings.Contains(string(m.Payload), "declined") {
					return nil, policy.Cached(errors.New("card declined"))
				}
				return nil, nil
			})
			ok := message.NewMessage("msg-ok-"+scope, []byte(`{"order":7}`))
			if _, err := h(ok); err != nil {
				t.Fatal(err)
			}
			failed := message.NewMessage("msg-failed-"+scope, []byte(`{"order":8,"card":"declined"}`))
			_, _ = h(failed) // the cached failure, which a dead-letter queue would hold

			v := jsonLines[inspectView](t, fx.cli(t, nil, "--json", "inspect", "--uuid", failed.UUID).mustCode(t, exitOK))
			if len(v) != 1 || v[0].Scope != scope || v[0].Status != "cached_failure" || v[0].MessageUUID != failed.UUID ||
				v[0].ErrorMessage != "card declined" || strings.Contains(v[0].Key, "msg-") {
				t.Fatalf("%s: inspect --json --uuid %s = %+v, want the cached failure under its content-hash key", scope, failed.UUID, v)
			}
			table := fx.cli(t, nil, "inspect", "--uuid", ok.UUID, "--scope", scope).mustCode(t, exitOK).stdout
			if !strings.Contains(table, "succeeded") || !strings.Contains(table, "message uuid  "+ok.UUID) {
				t.Fatalf("%s: inspect --uuid %s %s:\n%s", scope, ok.UUID, scope, table)
			}
			// The record also names its message in a plain inspect.
			plain := jsonObject[inspectView](t, fx.cli(t, nil, "--json", "inspect", "--scope", scope, "--key", v[0].Key).mustCode(t, exitOK))
			if plain.MessageUUID != failed.UUID {
				t.Fatalf("%s: inspect %s = %+v, want message UUID %s", scope, v[0].Key, plain, failed.UUID)
			}
			// Another scope, and a UUID no delivery claimed, find nothing.
			r2 := fx.cli(t, nil, "inspect", "--uuid", ok.UUID, "--scope=payments").mustCode(t, exitNotFound)
			if !strings.Contains(r2.stderr, "no record in scope payments was last claimed by message UUID "+ok.UUID) {
				t.Errorf("%s: inspect --uuid in another scope: %q", scope, r2.stderr)
			}
		}
		fx.cli(t, nil, "inspect", "--uuid", "never-delivered").mustCode(t, exitNotFound)
	})
}

// A message delivered to two handlers claimed a record in each scope: both
// are printed, one JSON line each.
func TestInspectByUUIDInSeveralScopes(t *testing.T) {
	t.Parallel()
	fx := newRedisFixture(t)
	msg := message.NewMessage("fan-out", []byte(`{"order":9}`))
	for _, scope := range []string{"billing", "shipping"} {
		r, err := receiver.New(fx.st).WithScope(scope).Build()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg); err != nil {
			t.Fatal(err)
		}
	}
	v := jsonLines[inspectView](t, fx.cli(t, nil, "--json", "inspect", "--uuid", msg.UUID).mustCode(t, exitOK))
	if len(v) != 2 || v[0].Scope != "billing" || v[1].Scope != "shipping" {
		t.Fatalf("inspect --uuid of a message two handlers ran: %+v", v)
	}
}
