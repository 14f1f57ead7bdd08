package main

import (
	"os/user"
	"strings"
	"testing"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store/postgres"
)

// TestWatermarkShowAndMove: show lists the rows of the watermark mode;
// move refuses without --force, then moves with an audit line on stderr.
func TestWatermarkShowAndMove(t *testing.T) {
	t.Parallel()
	fx := newPostgresFixture(t, postgres.LayoutDelete)
	st := fx.st.(*postgres.Store)
	if _, _, err := st.MoveWatermark(t.Context(), "orders", "payments", 2, 1500); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.MoveWatermark(t.Context(), "audit", "ledger", 0, 7); err != nil {
		t.Fatal(err)
	}

	table := fx.cli(t, nil, "watermark", "show").mustCode(t, exitOK).stdout
	for _, want := range []string{"GROUP", "NEXT OFFSET", "orders", "payments", "1500", "audit", "ledger"} {
		if !strings.Contains(table, want) {
			t.Errorf("watermark show lacks %q:\n%s", want, table)
		}
	}
	rows := jsonLines[watermarkView](t, fx.cli(t, nil, "--json", "watermark", "show", "--group=orders").mustCode(t, exitOK))
	if len(rows) != 1 || rows[0].Group != "orders" || rows[0].Topic != "payments" || rows[0].Partition != 2 || rows[0].Next != 1500 || rows[0].LastOffset != -1 {
		t.Fatalf("watermark show --group=orders: %+v", rows)
	}

	move := []string{"watermark", "move", "--group=orders", "--topic=payments", "--partition=2", "--offset=1200"}
	r := fx.cli(t, nil, move...).mustCode(t, exitRefused)
	if !strings.Contains(r.stderr, "--force") || strings.Contains(r.stderr, "audit") {
		t.Errorf("move without --force: stderr %q, want a refusal naming --force and no audit line", r.stderr)
	}
	if ws, _ := st.Watermarks(t.Context(), "orders", ""); len(ws) != 1 || ws[0].Next != 1500 {
		t.Fatalf("a refused move changed the row: %+v", ws)
	}

	r = fx.cli(t, nil, append([]string{"--json"}, append(move, "--force")...)...).mustCode(t, exitOK)
	out := jsonObject[moveView](t, r)
	if out.Action != "moved" || out.From == nil || *out.From != 1500 || out.To != 1200 {
		t.Errorf("move --force: %+v", out)
	}
	for _, want := range []string{"audit: Kafka watermark moved", "group=orders", "topic=payments", "partition=2", "from_offset=1500", "to_offset=1200"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the audit line lacks %q: %q", want, r.stderr)
		}
	}
	if ws, _ := st.Watermarks(t.Context(), "orders", ""); len(ws) != 1 || ws[0].Next != 1200 {
		t.Fatalf("after the move: %+v", ws)
	}

	// A partition without a row gets one.
	r = fx.cli(t, nil, "watermark", "move", "--group=new", "--topic=t", "--partition=0", "--offset=5", "--force").mustCode(t, exitOK)
	if !strings.Contains(r.stdout, "from none to 5") {
		t.Errorf("move of a new partition: %q", r.stdout)
	}
	// Only PostgreSQL keeps watermarks.
	r = runCLI(t, nil, "--store=redis", "watermark", "show").mustCode(t, exitUsage)
	if !strings.Contains(r.stderr, "PostgreSQL only") {
		t.Errorf("watermark show on redis: %q", r.stderr)
	}
	fx.cli(t, nil, "watermark", "move", "--group=g", "--topic=t", "--partition=-1", "--offset=0", "--force").mustCode(t, exitUsage)
}

// TestWatermarkNeedsTheTable: before a migration there is no table to show.
func TestWatermarkNeedsTheTable(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	r := runCLI(t, nil, append(postgresFlags(schema), "watermark", "show")...).mustCode(t, exitNotFound)
	if !strings.Contains(r.stderr, "migrate") {
		t.Errorf("show without a table: %q", r.stderr)
	}
}

// The audit line names the operator from the OS account when $USER is
// unset, as in a cron job or a container. Not parallel: it sets $USER.
func TestWatermarkAuditNamesTheOperatorWithoutUSER(t *testing.T) {
	t.Setenv("USER", "")
	u, err := user.Current()
	if err != nil || u.Username == "" {
		t.Fatalf("user.Current() = %+v, %v; want this process's account", u, err)
	}
	fx := newPostgresFixture(t, postgres.LayoutDelete)
	r := fx.cli(t, nil, "watermark", "move", "--group=g", "--topic=t", "--partition=0", "--offset=3", "--force").mustCode(t, exitOK)
	if want := "user=" + u.Username; !strings.Contains(r.stderr, want) {
		t.Fatalf("the audit line lacks %q: %q", want, r.stderr)
	}
}
