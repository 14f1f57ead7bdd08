package receiver_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

var errInsufficientFunds = errors.New("insufficient funds")

func Example() {
	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()

	r, err := receiver.New(st).
		WithKeyGenerator(keygen.UUID()).
		WithScope("payments").
		WithSuccessTTL(24 * time.Hour).
		WithFailureTTL(time.Hour).
		WithLease(30 * time.Second).
		WithCachedErrors(errInsufficientFunds).
		WithEventHandler(func(e pipeline.Event) { fmt.Println(e.Key, e.Outcome) }).
		Build()
	if err != nil {
		panic(err)
	}

	charge := r.Wrap(func(m *message.Message) ([]*message.Message, error) {
		lease, _ := pipeline.LeaseFromContext(m.Context())
		fmt.Println("charging", string(m.Payload), "attempt", lease.Attempt)
		return nil, nil
	})
	// The broker delivers the same message twice.
	for i := 0; i < 2; i++ {
		if _, err := charge(message.NewMessage("pay-1", []byte("12.00 EUR"))); err != nil {
			panic(err)
		}
	}
	// Output:
	// charging 12.00 EUR attempt 1
	// pay-1 executed
	// pay-1 replayed
}

func ExampleBuilder_Build_error() {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	_, err := receiver.New(st).WithLease(time.Second).WithHeartbeat(2 * time.Second).Build()
	fmt.Println(err)
	// Output:
	// oncemill: invalid receiver configuration: oncemill: invalid configuration: invalid policy: Heartbeat 2s is not shorter than Lease 1s; the lease would expire between beats: use at most Lease/2, e.g. 333.333333ms
}
