package filestore

import (
	"encoding/binary"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/oncemill/oncemill/store"
)

// Every field of store.Record, set to a value of its own, reads back as it
// was written, the fields added to store.Record later included: this test
// fills them by reflection.
func TestEncodingKeepsEveryRecordField(t *testing.T) {
	t.Parallel()
	var rec store.Record
	v := reflect.ValueOf(&rec).Elem()
	base := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	for i := range v.NumField() {
		f := v.Field(i)
		switch {
		case f.Type() == reflect.TypeFor[time.Time]():
			f.Set(reflect.ValueOf(base.Add(time.Duration(i) * time.Hour)))
		case f.Kind() == reflect.String:
			f.SetString(v.Type().Field(i).Name + "-\x00-é")
		case f.CanInt():
			f.SetInt(int64(i + 1))
		case f.Type() == reflect.TypeFor[[]byte]():
			f.SetBytes([]byte{0, byte(i), 0xFF})
		default:
			t.Fatalf("store.Record.%s is a %v, which this test cannot fill: teach it", v.Type().Field(i).Name, f.Type())
		}
	}
	e := &entry{Record: rec, purge: base.Add(time.Minute)}
	val, err := e.encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeEntry(recordKey(rec.Scope, rec.Key), val)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Record, rec) || !got.purge.Equal(e.purge) {
		t.Fatalf("read back\n%+v\nwrote\n%+v", got.Record, rec)
	}
	if expires, purge, _ := expiry(val); expires != rec.ExpiresAt.UnixNano() || purge != e.purge.UnixNano() {
		t.Fatalf("header = %d, %d; want %d, %d", expires, purge, rec.ExpiresAt.UnixNano(), e.purge.UnixNano())
	}
}

func TestSplitKey(t *testing.T) {
	t.Parallel()
	for _, sk := range [][2]string{{"", "k"}, {"a\x00b", "\x00"}, {"\x00\x00", ""}, {"s", "k\x00\x01"}} {
		scope, key, err := splitKey(recordKey(sk[0], sk[1]))
		if err != nil || scope != sk[0] || key != sk[1] {
			t.Errorf("splitKey(recordKey(%q, %q)) = %q, %q, %v", sk[0], sk[1], scope, key, err)
		}
	}
	for _, bad := range []string{"", "abc", "a\x00", "a\x00\x02k"} {
		if _, _, err := splitKey([]byte(bad)); err == nil {
			t.Errorf("splitKey(%q) accepted a key recordKey does not make", bad)
		}
	}
}

// A retryable record written before pauses existed has no RetryAt in its
// JSON: it reads as held back by nothing, and the next claim carries its
// attempt count on.
func TestRecordsBeforePausesAreNotHeldBack(t *testing.T) {
	t.Parallel()
	s, err := New(Options{Path: filepath.Join(t.TempDir(), "oncemill.db"), CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	now := time.Now().UTC()
	js := `{"Fingerprint":"fp","Status":4,"Token":7,"Attempt":2,"LeaseExpiresAt":"0001-01-01T00:00:00Z","Result":null,` +
		`"ErrorKind":"","ErrorMessage":"","CreatedAt":"` + now.Format(time.RFC3339Nano) + `","UpdatedAt":"` + now.Format(time.RFC3339Nano) +
		`","ExpiresAt":"` + now.Add(time.Hour).Format(time.RFC3339Nano) + `","MessageUUID":""}`
	v := binary.BigEndian.AppendUint64(nil, uint64(now.Add(time.Hour).UnixNano()))
	v = binary.BigEndian.AppendUint64(v, uint64(now.Add(time.Hour).UnixNano()))
	err = s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(recordsBucket).Put(recordKey("s", "k"), append(v, js...))
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(t.Context(), "s", "k")
	if err != nil || rec.Status != store.StatusRetryable || rec.Attempt != 2 || !rec.RetryAt.IsZero() {
		t.Fatalf("Get = %+v, %v; want retryable at attempt 2 without RetryAt", rec, err)
	}
	res, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: "k", Fingerprint: "fp", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute || res.Claim.Attempt != 3 {
		t.Fatalf("ClaimLease = %v attempt %d, %v; want execute at attempt 3", res.Decision, res.Claim.Attempt, err)
	}
}
