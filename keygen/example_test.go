package keygen_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
)

func ExampleUUID() {
	g := keygen.UUID()

	key, err := g.Key(message.NewMessage("8c2f0b1e-5d1a-4a34-9a57-0f8a4a5c2f10", []byte(`{}`)))
	fmt.Println(key, err)

	_, err = g.Key(message.NewMessage("", []byte(`{}`)))
	fmt.Println(errors.Is(err, keygen.ErrEmptyKey), errors.Is(err, keygen.ErrNoKey))
	// Output:
	// 8c2f0b1e-5d1a-4a34-9a57-0f8a4a5c2f10 <nil>
	// true true
}

func ExampleMetadata() {
	g, err := keygen.Metadata("Idempotency-Key")
	if err != nil {
		panic(err)
	}

	msg := message.NewMessage("uuid-1", []byte(`{"amount":10}`))
	msg.Metadata.Set("Idempotency-Key", "pay-7")
	key, _ := g.Key(msg)
	fmt.Println(key)

	_, err = g.Key(message.NewMessage("uuid-2", []byte(`{"amount":10}`)))
	fmt.Println(errors.Is(err, keygen.ErrMissingMetadata))
	fmt.Println(err)
	// Output:
	// pay-7
	// true
	// oncemill: no key: metadata field is missing or empty: "Idempotency-Key"
}

func ExampleContentHash() {
	g, err := keygen.ContentHash(keygen.ContentHashOptions{
		Exclude: []string{"meta.sent_at"},
	})
	if err != nil {
		panic(err)
	}

	first := message.NewMessage("uuid-1", []byte(`{"order":7,"amount":10.50,"meta":{"sent_at":"10:00:00"}}`))
	// A re-send: new UUID, new timestamp, members in another order.
	again := message.NewMessage("uuid-2", []byte(`{"meta":{"sent_at":"10:00:05"},"amount":10.5,"order":7}`))
	other := message.NewMessage("uuid-3", []byte(`{"order":8,"amount":10.50,"meta":{"sent_at":"10:00:00"}}`))

	k1, _ := g.Key(first)
	k2, _ := g.Key(again)
	k3, _ := g.Key(other)
	fmt.Println(k1)
	fmt.Println(k1 == k2, k1 == k3)
	// Output:
	// sha256:7a0a049b6c4da4a970e87d4dae2b354eb9a29f9bd69aa3cba93fcaadb19e0238
	// true false
}

func ExampleComposite() {
	tenant, err := keygen.Metadata("tenant")
	if err != nil {
		panic(err)
	}
	orderID := keygen.Func(func(msg *message.Message) (string, error) {
		return msg.Metadata.Get("order_id"), nil
	})
	g, err := keygen.Composite(tenant, orderID)
	if err != nil {
		panic(err)
	}

	msg := message.NewMessage("uuid-1", []byte(`{}`))
	msg.Metadata.Set("tenant", "acme")
	msg.Metadata.Set("order_id", "o:17")
	key, _ := g.Key(msg)
	fmt.Println(key)
	// Output:
	// 4:acme|4:o:17
}

func ExampleFunc() {
	// Key by where the message sits in the log, e.g. a Kafka topic,
	// partition and offset that the subscriber put on the context.
	type position struct {
		partition int32
		offset    int64
	}
	type ctxKey struct{}

	g := keygen.Func(func(msg *message.Message) (string, error) {
		pos, ok := msg.Context().Value(ctxKey{}).(position)
		if !ok {
			return "", fmt.Errorf("%w: no partition offset on the context", keygen.ErrNoKey)
		}
		topic := message.SubscribeTopicFromCtx(msg.Context())
		return fmt.Sprintf("%s/%d/%d", topic, pos.partition, pos.offset), nil
	})

	msg := message.NewMessage("uuid-1", []byte(`{}`))
	msg.SetContext(context.WithValue(context.Background(), ctxKey{}, position{partition: 3, offset: 1042}))
	key, err := g.Key(msg)
	fmt.Println(key, err)

	_, err = g.Key(message.NewMessage("uuid-2", []byte(`{}`)))
	fmt.Println(errors.Is(err, keygen.ErrNoKey))
	// Output:
	// /3/1042 <nil>
	// true
}

func ExampleStorableKey() {
	short := "order-42"
	long := "tenant-acme|" + strings.Repeat("line-item;", 50)

	fmt.Println(keygen.StorableKey(short, 255))
	fmt.Println(keygen.StorableKey(long, 255))
	fmt.Println(len(keygen.StorableKey(long, 255)))
	// Output:
	// order-42
	// hashed:sha256:cec60f364bdea07fd1210bc18381a3a104d78d9b6040934356b8cbb9a745233f
	// 78
}
