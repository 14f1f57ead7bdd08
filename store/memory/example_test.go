package memory_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

func Example() {
	s, err := memory.New(memory.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()

	req := store.BeginRequest{
		Scope:       "billing",
		Key:         "order-42",
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

	// A redelivery gets the stored result instead.
	second, err := s.Begin(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(second.Decision, second.Record.Status, string(second.Record.Result))

	// Output:
	// execute attempt 1
	// replay succeeded {"charged":true}
}
