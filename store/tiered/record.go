package tiered

import (
	"encoding/binary"
	"strconv"
	"strings"
	"time"

	"github.com/oncemill/oncemill/store"
)

// The Redis tier's values, this package's own format. A value is either a
// record or a tombstone:
//
//	record:    'R' 2 status token attempt created updated expires
//	           fingerprint errorKind errorMessage messageUUID hasResult result
//	tombstone: 'T'
//
// after 'R' comes the layout version (2; layout 1 had no messageUUID).
// status and hasResult are one
// byte each; token, attempt and the times (Unix nanoseconds, 0 for a zero
// time) are varints; the strings carry a uvarint length; the result is the
// rest of the value. A value of another layout or kind reads as a miss, so
// a newer layout can be introduced next to this one: an old worker only
// loses its hits.
const (
	kindRecord    = 'R'
	kindTombstone = 'T'
	layout        = 2
)

var tombstone = []byte{kindTombstone}

// idString is the stable, unambiguous form of an id used in Redis keys
// and invalidation messages: "<len(scope)>:<scope>:<key>". The length
// comes first, so no two ids share a form whatever bytes they hold.
func idString(k id) string {
	return strconv.Itoa(len(k.scope)) + ":" + k.scope + ":" + k.key
}

// parseID reads an idString back.
func parseID(s string) (id, bool) {
	n, rest, ok := strings.Cut(s, ":")
	if !ok {
		return id{}, false
	}
	l, err := strconv.Atoi(n)
	if err != nil || l < 0 || l+1 > len(rest) || rest[l] != ':' {
		return id{}, false
	}
	return id{scope: rest[:l], key: rest[l+1:]}, true
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// encodeRecord encodes a finished record.
func encodeRecord(r *store.Record) []byte {
	b := make([]byte, 0, 64+len(r.Fingerprint)+len(r.ErrorKind)+len(r.ErrorMessage)+len(r.MessageUUID)+len(r.Result))
	b = append(b, kindRecord, layout, byte(r.Status))
	b = binary.AppendVarint(b, r.Token)
	b = binary.AppendVarint(b, int64(r.Attempt))
	b = binary.AppendVarint(b, unixNano(r.CreatedAt))
	b = binary.AppendVarint(b, unixNano(r.UpdatedAt))
	b = binary.AppendVarint(b, unixNano(r.ExpiresAt))
	for _, s := range []string{r.Fingerprint, string(r.ErrorKind), r.ErrorMessage, r.MessageUUID} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	if r.Result == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	return append(b, r.Result...)
}

// decodeRecord decodes a value of k. ok is false for a tombstone, another
// layout, or anything that is not a finished record.
func decodeRecord(k id, v []byte) (r store.Record, ok bool) {
	if len(v) < 3 || v[0] != kindRecord || v[1] != layout {
		return r, false
	}
	r.Scope, r.Key, r.Status = k.scope, k.key, store.Status(v[2])
	if r.Status != store.StatusSucceeded && r.Status != store.StatusCachedFailure {
		return r, false
	}
	v = v[3:]
	var ints [5]int64
	for i := range ints {
		n, size := binary.Varint(v)
		if size <= 0 {
			return r, false
		}
		ints[i], v = n, v[size:]
	}
	r.Token, r.Attempt = ints[0], int(ints[1])
	r.CreatedAt, r.UpdatedAt, r.ExpiresAt = fromUnixNano(ints[2]), fromUnixNano(ints[3]), fromUnixNano(ints[4])
	var strs [4]string
	for i := range strs {
		n, size := binary.Uvarint(v)
		if size <= 0 || n > uint64(len(v)-size) {
			return r, false
		}
		strs[i], v = string(v[size:size+int(n)]), v[size+int(n):]
	}
	r.Fingerprint, r.ErrorKind, r.ErrorMessage, r.MessageUUID = strs[0], store.ErrorKind(strs[1]), strs[2], strs[3]
	switch {
	case len(v) == 1 && v[0] == 0:
	case len(v) >= 1 && v[0] == 1:
		r.Result = append([]byte{}, v[1:]...)
	default:
		return r, false
	}
	return r, true
}
