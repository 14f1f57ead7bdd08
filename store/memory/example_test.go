package memory_test

import (
	"context"
	"fmt"
	"log"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// The memory store behind a receiver: the handler runs once for a message
// delivered twice, and the store's Admin side shows the record.
func Example() {
	st, err := memory.New(memory.Options{})
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
	for range 2 { // the broker delivers it twice
		if _, err := charge(message.NewMessage("order-42", []byte("12.00 EUR"))); err != nil {
			log.Fatal(err)
		}
	}

	page, err := st.List(context.Background(), store.ListRequest{Scope: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	for _, rec := range page.Records {
		fmt.Println(rec.Key, rec.Status, "attempt", rec.Attempt)
	}
	// Output:
	// charging 12.00 EUR
	// order-42 succeeded attempt 1
}
