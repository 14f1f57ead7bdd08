package mysql_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store/mysql"
)

// New refuses options that cannot work, saying what to change, and needs
// no server to do so.
func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, tc := range []struct {
		opts mysql.Options
		want string
	}{
		{mysql.Options{Table: "Bad-Name"}, "not a plain identifier"},
		{mysql.Options{Table: strings.Repeat("t", 49)}, "at most 48"},
		{mysql.Options{MaxKeyLen: 1025}, "MaxKeyLen is 1025"},
		{mysql.Options{MaxResultBytes: 16 << 20}, "MaxResultBytes"},
		{mysql.Options{CleanupBatch: -1}, "CleanupBatch"},
		{mysql.Options{CleanupDuty: 1.5}, "CleanupDuty"},
		{mysql.Options{StatementTimeout: time.Microsecond}, "StatementTimeout"},
		{mysql.Options{TxOptions: sql.TxOptions{ReadOnly: true}}, "ReadOnly"},
		{mysql.Options{TxOptions: sql.TxOptions{Isolation: sql.LevelSnapshot}}, "Isolation"},
	} {
		if _, err := mysql.New(db, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v; want an error naming %q", tc.opts, err, tc.want)
		}
	}
	if _, err := mysql.New(nil, mysql.Options{}); err == nil || !strings.Contains(err.Error(), "sql.Open") {
		t.Errorf("New(nil) = %v; want an error saying to pass a pool", err)
	}
	s, err := mysql.New(db, mysql.Options{CleanupInterval: -1})
	if err != nil {
		t.Fatalf("New with the zero options: %v", err)
	}
	s.Close()
}

// Migrate is idempotent and records its version; stores of other tables in
// the same database do not meet.
func TestMigrate(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	s, err := mysql.New(db, mysql.Options{CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, err := s.AppliedVersion(t.Context()); err != nil || v != 0 {
		t.Fatalf("AppliedVersion before Migrate = %d, %v; want 0", v, err)
	}
	for range 2 {
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := s.AppliedVersion(t.Context()); err != nil || v != mysql.SchemaVersion {
		t.Fatalf("AppliedVersion after Migrate = %d, %v; want %d", v, err, mysql.SchemaVersion)
	}
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM oncemill_records_migrations").Scan(&n); err != nil || n != mysql.SchemaVersion {
		t.Fatalf("version rows = %d, %v; want one per version", n, err)
	}
	other := newStore(t, db, mysql.Options{Table: "other_records"})
	if v, err := other.AppliedVersion(t.Context()); err != nil || v != mysql.SchemaVersion {
		t.Fatalf("other table's AppliedVersion = %d, %v", v, err)
	}
}
