package filestore

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/oncemill/oncemill/store"
)

// The file's layout. recordsBucket maps a key of (scope, key) to a value;
// metaBucket holds the token counter and the layout's version.
var (
	recordsBucket = []byte("records")
	metaBucket    = []byte("meta")
	tokenKey      = []byte("token")
	formatKey     = []byte("format")
)

// formatVersion is the layout this package writes. A file of another
// version is refused rather than misread.
const formatVersion = 1

// recordKey is the bbolt key of (scope, key): the scope with each 0x00
// byte written as 0x00 0xFF, then 0x00 0x01, then the key as it is. bbolt
// orders keys bytewise, and this encoding keeps that order equal to the
// (scope, key) order of store.Admin.List, a shorter scope before the scopes
// it is a prefix of; a length prefix would order scopes by length instead.
// A scope's records are the keys that start with scopePrefix(scope).
func recordKey(scope, key string) []byte {
	b := appendScope(make([]byte, 0, len(scope)+2+len(key)), scope)
	return append(b, key...)
}

func scopePrefix(scope string) []byte {
	return appendScope(make([]byte, 0, len(scope)+2), scope)
}

func appendScope(b []byte, scope string) []byte {
	for i := range len(scope) {
		if scope[i] == 0 {
			b = append(b, 0, 0xFF)
		} else {
			b = append(b, scope[i])
		}
	}
	return append(b, 0, 1)
}

var errBadKey = errors.New("malformed record key")

// splitKey is recordKey's inverse.
func splitKey(k []byte) (scope, key string, err error) {
	var s []byte
	for i := 0; i < len(k); i++ {
		if k[i] != 0 {
			s = append(s, k[i])
			continue
		}
		if i+1 == len(k) {
			return "", "", errBadKey
		}
		switch k[i+1] {
		case 0xFF:
			s = append(s, 0)
			i++
		case 1:
			return string(s), string(k[i+2:]), nil
		default:
			return "", "", errBadKey
		}
	}
	return "", "", errBadKey
}

// A value is a header the sweeper reads without decoding the record, then
// the whole store.Record in JSON: a field added to store.Record is stored
// and read back with no code here. Scope and Key are left out of the JSON
// (the bbolt key holds them). A field missing from the JSON reads as its
// zero value, so the records of earlier versions read as they were: one
// released before store.Record.RetryAt existed holds nothing back. (An
// earlier version ignores the fields it does not know, so it reads a newer
// record too, without its pause.)
//
//	[0:8]  ExpiresAt, Unix nanoseconds, big-endian
//	[8:16] purge: when the sweeper may remove the record once it has also
//	       expired (the lease expiry plus the claim's LeaseRequest.Retain)
//	[16:]  the record's JSON
const headerLen = 16

// entry is a record as stored: the record and when it may be swept.
type entry struct {
	store.Record
	purge time.Time
}

func (e *entry) encode() ([]byte, error) {
	r := e.Record
	r.Scope, r.Key = "", ""
	js, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	v := make([]byte, headerLen, headerLen+len(js))
	binary.BigEndian.PutUint64(v[0:8], uint64(e.ExpiresAt.UnixNano()))
	binary.BigEndian.PutUint64(v[8:16], uint64(e.purge.UnixNano()))
	return append(v, js...), nil
}

// expiry reads the header of v: when its record expires, and when it may
// be swept once expired.
func expiry(v []byte) (expires, purge int64, err error) {
	if len(v) < headerLen {
		return 0, 0, fmt.Errorf("record value of %d bytes is shorter than its header", len(v))
	}
	return int64(binary.BigEndian.Uint64(v[0:8])), int64(binary.BigEndian.Uint64(v[8:16])), nil
}

// decodeEntry reads the entry stored under k. v belongs to the bbolt
// transaction; nothing of it is kept. A k or v that is not a record's is
// an error wrapping errUndecodable, naming the record.
func decodeEntry(k, v []byte) (*entry, error) {
	scope, key, err := splitKey(k)
	if err != nil {
		return nil, fmt.Errorf("record key %q: %w: %w", k, errUndecodable, err)
	}
	_, purge, err := expiry(v)
	if err == nil {
		e := &entry{purge: time.Unix(0, purge).UTC()}
		if err = json.Unmarshal(v[headerLen:], &e.Record); err == nil {
			e.Scope, e.Key = scope, key
			return e, nil
		}
	}
	return nil, fmt.Errorf("record %q/%q: %w: %w", scope, key, errUndecodable, err)
}
