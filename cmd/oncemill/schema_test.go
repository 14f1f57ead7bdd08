package main

import (
	"context"
	"crypto/rand"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
)

// Without --postgres-schema the CLI looks where the library puts the table
// when postgres.Options leaves Schema empty: a table made by workers with
// the zero Options is seen by stats and list, and migrate finds it instead
// of making a second, empty one. A fresh database of its own, so that its
// public schema holds only this test's table.
func TestDefaultSchemaIsTheLibrarys(t *testing.T) {
	t.Parallel()
	dsn := freshDatabase(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := postgres.New(pool, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	r, err := receiver.New(st).WithScope("orders").Build()
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage("order-1", []byte(`{"order":1}`))
	if _, err := r.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg); err != nil {
		t.Fatal(err)
	}

	flags := []string{"--store=postgres", "--postgres-dsn=" + dsn}
	stats := jsonObject[statsView](t, runCLI(t, nil, append(flags, "--json", "stats")...).mustCode(t, exitOK))
	if stats.Records != 1 || stats.Live != 1 {
		t.Errorf("stats without --postgres-schema: %+v, want the library's one record", stats)
	}
	list := jsonLines[recordView](t, runCLI(t, nil, append(flags, "--json", "list")...).mustCode(t, exitOK))
	if len(list) != 1 || list[0].Scope != "orders" || list[0].Key != msg.UUID || list[0].Status != "succeeded" {
		t.Errorf("list without --postgres-schema: %+v, want the library's record", list)
	}
	m := jsonObject[migration](t, runCLI(t, nil, append(flags, "--json", "migrate")...).mustCode(t, exitOK))
	if m.Changed || m.From == 0 || m.Target != libraryDefaultSchema+".oncemill_records" {
		t.Errorf("migrate without --postgres-schema: %+v, want the library's table %s.oncemill_records, unchanged", m, libraryDefaultSchema)
	}
	var tables int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_class WHERE relname = 'oncemill_records' AND relkind = 'r'").Scan(&tables); err != nil || tables != 1 {
		t.Errorf("%d records tables in the database (%v), want the library's one", tables, err)
	}
}

// freshDatabase creates a database of a random name on the test server and
// returns its DSN; it is dropped when the test ends.
func freshDatabase(t *testing.T) string {
	t.Helper()
	admin := testenv.Pool(t)
	name := "oncemill_cli_" + strings.ToLower(rand.Text()[:10])
	if _, err := admin.Exec(t.Context(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("CREATE DATABASE %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("DROP DATABASE %s: %v", name, err)
		}
	})
	u, err := url.Parse(testenv.PostgresDSN())
	if err != nil {
		t.Fatalf("the test DSN: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}
