package kafkakeys_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/keygen/kafkakeys"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

// A receiver keyed by Kafka offsets. Consumed by watermill-kafka through a
// router, a message's key is "<topic>/<partition>/<offset>"; a message from
// anywhere else has no key, and is rejected as a permanent failure.
func ExampleOffset() {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	r, err := receiver.New(st).WithKeyGenerator(kafkakeys.Offset()).Build()
	if err != nil {
		panic(err)
	}
	_ = r // router.AddMiddleware(r.Middleware) on a watermill-kafka subscriber

	_, err = kafkakeys.Offset().Key(message.NewMessage("m-1", nil))
	fmt.Println(err)
	// Output: oncemill: no key: the message's context holds no Kafka partition and offset (not consumed by watermill-kafka through a router)
}

// The watermark mode's position: topic, partition and offset of a message
// consumed by watermill-kafka. With a PostgreSQL store st it configures
// receiver.NewTransactional(st).WithKafkaWatermark(w) (docs/kafka.md, The
// watermark mode); kafkakeys.HighWaterMark(client) asks Kafka through a
// sarama.Client.
func ExamplePosition() {
	w := pipeline.KafkaWatermark{
		Group:    "ledger", // the subscriber's ConsumerGroup
		Position: kafkakeys.Position,
		HighWaterMark: func(context.Context, string, int32) (int64, error) {
			return 0, errors.New("use kafkakeys.HighWaterMark(client)")
		},
	}
	_, err := w.Position(message.NewMessage("m-1", nil))
	fmt.Println(errors.Is(err, keygen.ErrNoKey))
	// Output: true
}
