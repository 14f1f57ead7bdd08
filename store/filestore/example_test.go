package filestore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/filestore"
)

// The file store behind a receiver: a message delivered again after the
// worker restarted is not handled again, because the file remembers it.
func Example() {
	dir, err := os.MkdirTemp("", "oncemill")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "oncemill.db")

	run := func() { // one life of the worker process
		st, err := filestore.New(filestore.Options{Path: path})
		if err != nil {
			log.Fatal(err)
		}
		defer st.Close() // releases the file for the next process
		r, err := receiver.New(st).WithScope("billing").Build()
		if err != nil {
			log.Fatal(err)
		}
		charge := r.Middleware(func(m *message.Message) ([]*message.Message, error) {
			fmt.Println("charging", string(m.Payload))
			return nil, nil
		})
		if _, err := charge(message.NewMessage("order-42", []byte("12.00 EUR"))); err != nil {
			log.Fatal(err)
		}
	}
	run()
	run() // restarted, the broker delivers it again

	st, err := filestore.New(filestore.Options{Path: path})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
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
