package tiered_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/tiered"
)

// The tiered store behind a receiver: PostgreSQL decides, Redis and the
// process's own LRU answer the duplicates.
func Example() {
	ctx := context.Background()
	dsn := os.Getenv("ONCEMILL_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test"
	}
	addr := os.Getenv("ONCEMILL_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	pg, err := postgres.New(pool, postgres.Options{Schema: "oncemill_example"})
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Close()
	if err := pg.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	// ContextTimeoutEnabled lets Options.RedisTimeout bound every call;
	// New refuses a client without it.
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer client.Close()

	// Counting which tier answered, for the example's output.
	reader := sdkmetric.NewManualReader()
	st, err := tiered.New(pg, client, tiered.Options{
		Prefix:        "oncemill-example",
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	r, err := receiver.New(st).WithScope("billing").Build()
	if err != nil {
		log.Fatal(err)
	}
	charge := r.Middleware(func(m *message.Message) ([]*message.Message, error) {
		fmt.Println("charging", string(m.Payload))
		return nil, nil
	})
	uuid := "order-" + rand.Text() // a fresh key for every run of the example
	// Afterwards, an operator's delete: under the token of what Get read.
	defer func() {
		if rec, err := st.Get(ctx, "billing", uuid); err == nil {
			_ = st.Delete(ctx, "billing", uuid, rec.Token)
		}
	}()
	for range 3 { // the broker delivers it three times
		if _, err := charge(message.NewMessage(uuid, []byte("12.00 EUR"))); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "oncemill.store.tier.replays" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				tier, _ := p.Attributes.Value("tier")
				fmt.Println("replays from the", tier.AsString(), "tier:", p.Value)
			}
		}
	}
	// Output:
	// charging 12.00 EUR
	// replays from the local tier: 2
}
