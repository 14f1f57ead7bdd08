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
	if _, _, err := st.MoveWatermark(t.Context(), "orders", "payments", 2, 1500, true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.MoveWatermark(t.Context(), "audit", "ledger", 0, 7, true); err != nil {
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

	// A partition without a row (a mistyped group, say) gets one only with --create.
	newRow := []string{"watermark", "move", "--group=new", "--topic=t", "--partition=0", "--offset=5", "--force"}
	r = fx.cli(t, nil, newRow...).mustCode(t, exitNotFound)
	if !strings.Contains(r.stderr, "no watermark row") || !strings.Contains(r.stderr, "--create") || strings.Contains(r.stderr, "audit") {
		t.Errorf("move of a partition without a row: stderr %q, want a refusal naming --create and no audit line", r.stderr)
	}
	if ws, _ := st.Watermarks(t.Context(), "new", ""); len(ws) != 0 {
		t.Fatalf("a refused move created a row: %+v", ws)
	}
	r = fx.cli(t, nil, append(newRow, "--create")...).mustCode(t, exitOK)
	if !strings.Contains(r.stdout, "from none to 5") || !strings.Contains(r.stderr, "from_offset=none") {
		t.Errorf("move --create of a new partition: stdout %q, stderr %q", r.stdout, r.stderr)
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
	r := fx.cli(t, nil, "watermark", "move", "--group=g", "--topic=t", "--partition=0", "--offset=3", "--force", "--create").mustCode(t, exitOK)
	if want := "user=" + u.Username; !strings.Contains(r.stderr, want) {
		t.Fatalf("the audit line lacks %q: %q", want, r.stderr)
	}
}

// delete removes one partition's row, refused without --force, with an
// audit line as move's; a partition without a row exits 3.
func TestWatermarkDelete(t *testing.T) {
	t.Parallel()
	fx := newPostgresFixture(t, postgres.LayoutDelete)
	st := fx.st.(*postgres.Store)
	for _, p := range []int32{0, 1} {
		if _, _, err := st.MoveWatermark(t.Context(), "orderz", "payments", p, 40, true); err != nil {
			t.Fatal(err)
		}
	}
	del := []string{"watermark", "delete", "--group=orderz", "--topic=payments", "--partition=1"}
	r := fx.cli(t, nil, del...).mustCode(t, exitRefused)
	if !strings.Contains(r.stderr, "--force") || strings.Contains(r.stderr, "audit") {
		t.Errorf("delete without --force: stderr %q, want a refusal naming --force and no audit line", r.stderr)
	}
	if ws, _ := st.Watermarks(t.Context(), "orderz", ""); len(ws) != 2 {
		t.Fatalf("a refused delete changed the rows: %+v", ws)
	}

	r = fx.cli(t, nil, append([]string{"--json"}, append(del, "--force")...)...).mustCode(t, exitOK)
	if out := jsonObject[deleteView](t, r); out != (deleteView{Action: "deleted", Group: "orderz", Topic: "payments", Partition: 1, From: 40}) {
		t.Errorf("delete --force printed %+v", out)
	}
	for _, want := range []string{"audit: Kafka watermark deleted", "group=orderz", "topic=payments", "partition=1", "from_offset=40", "user="} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the audit line lacks %q: %q", want, r.stderr)
		}
	}
	if ws, _ := st.Watermarks(t.Context(), "orderz", ""); len(ws) != 1 || ws[0].Partition != 0 {
		t.Fatalf("after the delete: %+v, want partition 0 only", ws)
	}

	r = fx.cli(t, nil, append(del, "--force")...).mustCode(t, exitNotFound)
	if !strings.Contains(r.stderr, "no watermark row") || !strings.Contains(r.stderr, "oncemill watermark show") {
		t.Errorf("delete of a partition without a row: stderr %q", r.stderr)
	}
	runCLI(t, nil, "--store=redis", "watermark", "delete", "--group=g", "--topic=t", "--partition=0", "--force").mustCode(t, exitUsage)
}
