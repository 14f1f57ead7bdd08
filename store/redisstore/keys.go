package redisstore

import (
	"strconv"
	"strings"
	"sync"
)

// Redis Cluster maps a key to one of 16384 slots by the CRC16 (XMODEM) of
// its hash tag: the part between the first '{' and the next '}'. A script
// may only touch keys of one slot.
//
// A record's key carries a hash tag picked so that the key lands in the slot
// that the CRC16 of the record's identity points to:
//
//	<prefix>:{<tag>}:r:<len(scope)>:<scope>:<key>   the record (a string, record.go)
//
// <tag> is slotTag(crc16(identity) mod 16384), where identity is
// "<len(scope)>:<scope>:<key>" and slotTag(n) is the first string in the
// sequence "0", "1", ..., "z", "10", ... (base 36) whose own slot is n. So
// records spread over all slots as evenly as CRC16 spreads identities.
// (Layout 0 kept a token counter per slot, <prefix>:{<tag>}:t, which the tag
// put beside the slot's records; layout 1 reads none.)
//
// The tags and the layout are part of the stored format: workers of every
// version must compute the same key for the same (scope, key), so none of
// this may change without a migration. TestSlotTagsPinned pins them.

const numSlots = 16384

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum
// Redis Cluster uses for key slots.
func crc16(crc uint16, s string) uint16 {
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// slotTags returns, for every slot, the first base-36 string that hashes to
// it. Computed once per process (about 170,000 CRCs of 1 to 4 bytes).
var slotTags = sync.OnceValue(func() *[numSlots]string {
	var tags [numSlots]string
	filled := 0
	for n := uint64(0); filled < numSlots; n++ {
		s := strconv.FormatUint(n, 36)
		slot := crc16(0, s) % numSlots
		if tags[slot] == "" {
			tags[slot] = s
			filled++
		}
	}
	return &tags
})

// keysFor returns the Redis key of (scope, key)'s record under prefix.
func keysFor(prefix, scope, key string) string {
	n := strconv.Itoa(len(scope))
	// The identity is n ":" scope ":" key; hash it without building it.
	crc := crc16(0, n)
	crc = crc16(crc, ":")
	crc = crc16(crc, scope)
	crc = crc16(crc, ":")
	crc = crc16(crc, key)
	tag := slotTags()[crc%numSlots]

	var b strings.Builder
	b.Grow(len(prefix) + len(tag) + len(n) + len(scope) + len(key) + 10)
	b.WriteString(prefix)
	b.WriteString(":{")
	b.WriteString(tag)
	b.WriteString("}:r:")
	b.WriteString(n)
	b.WriteByte(':')
	b.WriteString(scope)
	b.WriteByte(':')
	b.WriteString(key)
	return b.String()
}

// recordPattern is the SCAN pattern matching every record key under prefix
// (and no layout-0 counter key). The prefix holds no glob characters (see
// validPrefix).
func recordPattern(prefix string) string { return prefix + ":{*}:r:*" }

// parseRecordKey returns the scope and key of a record key under prefix.
func parseRecordKey(prefix, k string) (scope, key string, ok bool) {
	rest, ok := strings.CutPrefix(k, prefix+":{")
	if !ok {
		return "", "", false
	}
	if _, rest, ok = strings.Cut(rest, "}:r:"); !ok {
		return "", "", false
	}
	n, rest, ok := strings.Cut(rest, ":")
	size, err := strconv.Atoi(n)
	if !ok || err != nil || size < 0 || len(rest) < size+1 || rest[size] != ':' {
		return "", "", false
	}
	return rest[:size], rest[size+1:], true
}
