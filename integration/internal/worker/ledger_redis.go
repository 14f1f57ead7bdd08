package worker

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// redisLedger books charges in a Redis hash per scope: payment_id -> number
// of charges. HINCRBY is atomic, so two workers charging the same payment
// leave 2, never a lost update. It is written after the effect and before
// oncemill records the success, as any side effect outside the store's
// transaction would be.
type redisLedger struct {
	client redis.UniversalClient
	prefix string
}

func newRedisLedger(client redis.UniversalClient, prefix string) *redisLedger {
	return &redisLedger{client: client, prefix: prefix}
}

// key is the hash of one scope; the braces make it one Redis Cluster slot.
func (l *redisLedger) key(scope string) string {
	return fmt.Sprintf("%s:ledger:{%s}", l.prefix, scope)
}

func (l *redisLedger) Charge(ctx context.Context, c Charge) error {
	return l.client.HIncrBy(ctx, l.key(c.Scope), c.PaymentID, 1).Err()
}

func (l *redisLedger) Counts(ctx context.Context, scope string) (map[string]int, error) {
	m, err := l.client.HGetAll(ctx, l.key(scope)).Result()
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	out := make(map[string]int, len(m))
	for id, v := range m {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("ledger: %s of %s is %q: %w", id, l.key(scope), v, err)
		}
		out[id] = n
	}
	return out, nil
}
