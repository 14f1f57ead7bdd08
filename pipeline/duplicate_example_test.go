package pipeline_test

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
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
	stage, err := pipeline.NewLeased(st, pipeline.Config{
		Scope:  "payments",
		Policy: policy.Policy{FinishedKey: policy.FinishedKeyReject},
		EventHandler: func(e pipeline.Event) {
			var dup *pipeline.DuplicateError
			if errors.As(e.Err, &dup) {
				fmt.Printf("%v: key %s is %v (attempt %d), rejected: %v\n",
					e.Outcome, dup.Key, dup.Status, dup.Attempt, errors.Is(e.Err, pipeline.ErrDuplicateRejected))
				return
			}
			fmt.Println(e.Outcome)
		},
	})
	if err != nil {
		panic(err)
	}
	h := stage.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for range 2 { // a duplicate publish
		if _, err := h(message.NewMessage("pay-42", []byte("charge 10 EUR"))); err != nil {
			panic(err)
		}
	}
	// Output:
	// executed
	// rejected: key pay-42 is succeeded (attempt 1), rejected: true
}
