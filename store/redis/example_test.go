package redis_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store"
	oredis "github.com/oncemill/oncemill/store/redis"
)

func Example() {
	addr := os.Getenv("ONCEMILL_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	client := goredis.NewClient(&goredis.Options{Addr: addr})
	defer client.Close()

	// Every worker that uses this Redis and prefix shares the records.
	s, err := oredis.New(client, oredis.Options{Prefix: "oncemill-example"})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	// Runs of this example share the Redis: each takes a key of its own.
	key := "order-42/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer s.Delete(ctx, "billing", key)

	req := store.BeginRequest{
		Scope:       "billing",
		Key:         key,
		Fingerprint: "sha256:9f86d08",
		Lease:       30 * time.Second,
	}

	// The first delivery owns the key and runs the handler.
	first, err := s.Begin(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Decision, "attempt", first.Lease.Attempt)

	err = s.Complete(ctx, first.Lease, store.Completion{
		Status: store.StatusSucceeded,
		Result: []byte(`{"charged":true}`),
		TTL:    24 * time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}

	// A redelivery, by any worker on the same Redis, gets the stored result.
	second, err := s.Begin(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(second.Decision, second.Record.Status, string(second.Record.Result))

	// Output:
	// execute attempt 1
	// replay succeeded {"charged":true}
}
