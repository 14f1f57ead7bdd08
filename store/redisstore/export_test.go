package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Test-only hooks.

// AdvanceClock moves s's clock forward by d. The store judges every expiry
// by Redis's native TTLs, so each record under s's prefix loses d of its TTL
// (one whose TTL runs out is deleted): Redis cannot tell that apart from
// time passing.
func AdvanceClock(s *Store, d time.Duration) {
	ctx := context.Background()
	err := s.eachNode(ctx, func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, recordPattern(s.prefix), scanCount).Iterator()
		for iter.Next(ctx) {
			key := iter.Val()
			ttl, err := c.PTTL(ctx, key).Result()
			if err != nil || ttl < 0 {
				continue
			}
			if left := ttl - d; left > 0 {
				err = c.PExpire(ctx, key, left).Err()
			} else {
				err = c.Del(ctx, key).Err()
			}
			if err != nil {
				return err
			}
		}
		return iter.Err()
	})
	if err != nil {
		panic(err)
	}
}

// KeysFor returns the Redis key of (scope, key)'s record.
func KeysFor(s *Store, scope, key string) string { return keysFor(s.prefix, scope, key) }

// SlotTag returns the hash tag that maps to slot n.
func SlotTag(n int) string { return slotTags()[n] }

// CRC16 is the package's CRC-16/XMODEM.
func CRC16(s string) uint16 { return crc16(0, s) }

const NumSlots = numSlots

// SetPipeAbove sets how many calls must be under way before commands go
// through the AutoPipeliner (Options.AutoPipeline).
func SetPipeAbove(s *Store, n int) { s.pipeAbove = int32(n) }

// SetIfEqRefused reports whether s's server refused SET ... IFEQ, so that s
// sends setIfEqScript instead.
func SetIfEqRefused(s *Store) bool { return s.noSetIfEq.Load() }

// ScriptName names the store's script whose SHA1 is sha ("finish script"),
// or returns "" for none of them.
func ScriptName(sha string) string {
	for name, script := range map[string]*redis.Script{
		"claim": claimScript, "finish": finishScript, "setIfEq": setIfEqScript, "extend": extendScript,
		"delete": deleteScript, "get": getScript, "migrate": migrateScript, "abandon": abandonScript,
	} {
		if script.Hash() == sha {
			return name + " script"
		}
	}
	return ""
}

// Prefix returns the key prefix in use.
func (s *Store) Prefix() string { return s.prefix }
