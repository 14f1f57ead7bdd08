package main

// The payments handler, oncemill's receiver around it, and the ledger (the
// effect that must happen once) beside the idempotency store.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/redisstore"
)

// command is what the handler consumes. Meta is the envelope: it changes
// when the same command is sent again, so it is not part of the key.
type command struct {
	PaymentID   string `json:"payment_id"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Meta        struct {
		SentAt  string `json:"sent_at"`
		Attempt int    `json:"attempt"`
	} `json:"meta"`
}

// errInvalidAmount never becomes valid: oncemill caches the failure, and a
// duplicate is acked without running the handler again.
var errInvalidAmount = errors.New("invalid amount: amount_cents must be positive")

// handle charges one payment and returns its payment.settled event.
func (w *worker) handle(msg *message.Message) ([]*message.Message, error) {
	var cmd command
	if err := json.Unmarshal(msg.Payload, &cmd); err != nil {
		return nil, policy.Cached(fmt.Errorf("decode payment command: %w", err))
	}
	if cmd.AmountCents <= 0 {
		return nil, policy.Cached(fmt.Errorf("payment %s: %w (got %d)", cmd.PaymentID, errInvalidAmount, cmd.AmountCents))
	}
	// A process paused longer than the lease (a VM freeze) may have lost its
	// key to a duplicate: confirm the lease right before the effect.
	if err := pipeline.CheckLease(msg.Context()); err != nil {
		return nil, policy.Retryable(fmt.Errorf("payment %s: lease check: %w", cmd.PaymentID, err))
	}
	claim, _ := pipeline.ClaimFromContext(msg.Context())
	if err := w.stores.charge(msg.Context(), cmd.PaymentID, msg.UUID, claim); err != nil {
		return nil, policy.Retryable(fmt.Errorf("payment %s: booking the charge: %w", cmd.PaymentID, err))
	}
	payload, err := json.Marshal(map[string]any{"payment_id": cmd.PaymentID, "account": cmd.Account, "amount_cents": cmd.AmountCents, "currency": cmd.Currency})
	if err != nil {
		return nil, err
	}
	settled := message.NewMessage(watermill.NewUUID(), payload)
	settled.Metadata.Set("type", "payment.settled")
	if claim.Token != 0 { // lets a downstream system refuse a stale worker's write
		settled.Metadata.Set("fencing_token", strconv.FormatInt(claim.Token, 10))
	}
	return []*message.Message{settled}, nil
}

// newReceiver is oncemill's receiver. With PostgreSQL, the one-transaction
// mode: the ledger row and the "processed" record commit together.
func (w *worker) newReceiver(onEvent func(pipeline.Event)) (*receiver.Receiver, error) {
	p := policy.Policy{
		LeaseDuration:  w.cfg.lease,     // the heartbeat renews it every lease/3
		HeldKeyTimeout: 3 * w.cfg.lease, // a duplicate waits this long for a running one
		NackDelay:      w.cfg.lease / 10,
		CachedErrors:   []error{errInvalidAmount},
	}
	b := receiver.New(w.stores.store)
	if w.stores.tx != nil {
		b, p.LeaseDuration = receiver.NewTransactional(w.stores.tx), 0
	}
	b = b.WithKeyGenerator(w.keys).WithScope(w.cfg.scope).WithPolicy(p).WithLogger(w.log).WithEventHandler(onEvent).
		WithDeadLetter(w.broker.pub, w.topic("dead-letters")).WithMeterProvider(w.meters)
	if w.broker.system.Valid() {
		b = b.WithMessagingSystem(w.broker.system)
	}
	if w.tracer != nil {
		b = b.WithTracerProvider(w.tracer)
	}
	return b.Build()
}

// stores is the idempotency store and the ledger beside it: charge books a
// charge, counts returns the charges per payment_id of the scope.
type stores struct {
	store  store.Store
	tx     store.Transactional // postgres: the one-transaction mode
	charge func(ctx context.Context, paymentID, uuid string, c store.Claim) error
	counts func(ctx context.Context) (map[string]int, error)
	ping   func(context.Context) error // the readiness probe
	close  func()
}

func openStore(ctx context.Context, cfg config) (*stores, error) {
	switch cfg.store {
	case "postgres":
		pc, err := pgxpool.ParseConfig(cfg.postgresDSN)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(cfg.postgresDSN, "pool_max_conns") {
			pc.MaxConns = int32(cfg.partitions + 4) // each handler holds one for its transaction
		}
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return nil, err
		}
		st, err := postgres.New(pool, postgres.Options{Schema: cfg.postgresSchema})
		if err == nil {
			err = st.Migrate(ctx)
		}
		// No unique constraint, on purpose: a second charge is a second row.
		table := pgx.Identifier{cfg.postgresSchema, "oncemill_ledger"}.Sanitize()
		if err == nil {
			_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (id bigserial PRIMARY KEY, scope text NOT NULL, payment_id text NOT NULL,
	message_uuid text NOT NULL, fencing_token bigint NOT NULL, attempt integer NOT NULL, charged_at timestamptz NOT NULL DEFAULT now())`)
		}
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %w", err)
		}
		return &stores{store: st, tx: st, ping: pool.Ping, close: pool.Close,
			charge: func(ctx context.Context, id, uuid string, c store.Claim) error {
				exec := pool.Exec
				if tx, ok := postgres.TxFromContext(ctx); ok { // in the transaction of the record
					exec = tx.Exec
				}
				_, err := exec(ctx, `INSERT INTO `+table+` (scope, payment_id, message_uuid, fencing_token, attempt) VALUES ($1, $2, $3, $4, $5)`,
					cfg.scope, id, uuid, c.Token, c.Attempt)
				return err
			},
			counts: func(ctx context.Context) (map[string]int, error) {
				rows, _ := pool.Query(ctx, `SELECT payment_id, count(*) FROM `+table+` WHERE scope = $1 GROUP BY payment_id`, cfg.scope)
				out, id, n := map[string]int{}, "", 0
				_, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
				return out, err
			},
		}, nil
	case "redis":
		client := redis.NewClient(&redis.Options{Addr: cfg.redisAddr, PoolSize: 2*cfg.partitions + 10})
		st, err := redisstore.New(client, redisstore.Options{Prefix: cfg.redisPrefix})
		if err == nil {
			err = client.Ping(ctx).Err()
		}
		if err != nil {
			_ = client.Close()
			return nil, fmt.Errorf("redis (%s): %w", cfg.redisAddr, err)
		}
		// The ledger is a hash, payment_id -> charges, written after the effect.
		key := cfg.redisPrefix + ":ledger:{" + cfg.scope + "}"
		return &stores{store: st, close: func() { _ = client.Close() },
			ping: func(ctx context.Context) error { return client.Ping(ctx).Err() },
			charge: func(ctx context.Context, id, _ string, _ store.Claim) error {
				return client.HIncrBy(ctx, key, id, 1).Err()
			},
			counts: func(ctx context.Context) (map[string]int, error) {
				m, err := client.HGetAll(ctx, key).Result()
				out := map[string]int{}
				for id, v := range m {
					out[id], _ = strconv.Atoi(v)
				}
				return out, err
			},
		}, nil
	}
	st, err := memory.New(memory.Options{})
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	charges := map[string]int{}
	return &stores{store: st, close: func() { _ = st.Close() },
		ping: func(context.Context) error { return nil },
		charge: func(_ context.Context, id, _ string, _ store.Claim) error {
			mu.Lock()
			defer mu.Unlock()
			charges[id]++
			return nil
		},
		counts: func(context.Context) (map[string]int, error) {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(charges), nil
		},
	}, nil
}
