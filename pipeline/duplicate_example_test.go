package pipeline_test

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

// A duplicate of a finished message, under policy.FinishedKeyReject, is
// acked as a rejection; its error says what the store holds for the key.
func ExampleDuplicateError() {
	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	r, err := receiver.New(st).
		WithScope("payments").
		WithPolicy(policy.Policy{FinishedKey: policy.FinishedKeyReject}).
		WithEventHandler(func(e pipeline.Event) {
			var dup *pipeline.DuplicateError
			if errors.As(e.Err, &dup) {
				fmt.Printf("%v: key %s is %v (attempt %d), rejected: %v\n",
					e.Outcome, dup.Key, dup.Status, dup.Attempt, errors.Is(e.Err, pipeline.ErrDuplicateRejected))
				return
			}
			fmt.Println(e.Outcome)
		}).
		Build()
	if err != nil {
		panic(err)
	}
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for range 2 { // a duplicate publish
		if _, err := h(message.NewMessage("pay-42", []byte("charge 10 EUR"))); err != nil {
			panic(err)
		}
	}
	// Output:
	// executed
	// rejected: key pay-42 is succeeded (attempt 1), rejected: true
}
