package redis

import "time"

// Test-only hooks. The store's clock is the Redis server's TIME plus an
// offset that only these hooks change: storetest's Harness.Advance moves it
// forward, which the scripts cannot tell apart from time passing.

// AdvanceClock moves s's clock forward by d.
func AdvanceClock(s *Store, d time.Duration) { s.offsetUS.Add(micros(d)) }

// SetClockOffset sets s's clock to the server's TIME plus d (d may be
// negative: a clock that stepped back).
func SetClockOffset(s *Store, d time.Duration) { s.offsetUS.Store(int64(d / time.Microsecond)) }

// KeysFor returns the Redis keys of (scope, key): the record and the token
// counter of its slot.
func KeysFor(s *Store, scope, key string) (record, token string) {
	k := keysFor(s.prefix, scope, key)
	return k.record, k.token
}

// SlotTag returns the hash tag that maps to slot n.
func SlotTag(n int) string { return slotTags()[n] }

// CRC16 is the package's CRC-16/XMODEM.
func CRC16(s string) uint16 { return crc16(0, s) }

const NumSlots = numSlots
