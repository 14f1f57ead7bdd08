package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/redisstore"
)

// The Redis store behind a receiver: every worker on the same Redis and
// prefix shares the records, so a redelivery to any of them is replayed.
func Example() {
	addr := os.Getenv("ONCEMILL_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	st, err := redisstore.New(client, redisstore.Options{Prefix: "oncemill-example"})
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
	// Runs of this example share the Redis: each takes a key of its own.
	uuid := "order-42/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for range 2 { // the broker delivers it twice
		if _, err := charge(message.NewMessage(uuid, []byte("12.00 EUR"))); err != nil {
			log.Fatal(err)
		}
	}

	rec, err := st.Get(context.Background(), "billing", uuid)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.Status, "attempt", rec.Attempt)
	// An operator deletes what they read: under its token.
	if err := st.Delete(context.Background(), "billing", uuid, rec.Token); err != nil {
		log.Fatal(err)
	}
	// Output:
	// charging 12.00 EUR
	// succeeded attempt 1
}
