package filestore

import (
	"reflect"
	"testing"
	"time"

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
