package pipeline_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/store/memory"
)

// The idempotency stage used alone, as a plain Watermill middleware.
func ExampleIdempotency_Middleware() {
	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	stage, err := pipeline.NewIdempotency(pipeline.IdempotencyConfig{
		Store:   st,
		Keys:    keygen.UUID(),
		Scope:   "invoices",
		OnEvent: func(e pipeline.Event) { fmt.Println("outcome:", e.Outcome) },
	})
	if err != nil {
		panic(err)
	}
	handler := stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		fmt.Println("issuing invoice for", string(m.Payload))
		return []*message.Message{message.NewMessage("invoice-1", []byte("issued"))}, nil
	})
	for i := 0; i < 2; i++ {
		out, _ := handler(message.NewMessage("order-7", []byte("order 7")))
		fmt.Println("produced:", out[0].UUID)
	}
	// Output:
	// issuing invoice for order 7
	// outcome: executed
	// produced: invoice-1
	// outcome: replayed
	// produced: invoice-1
}
