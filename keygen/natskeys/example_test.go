package natskeys_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen/natskeys"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

// A receiver keyed by JetStream stream sequences. The subscriber reads
// messages through natskeys.Unmarshaler (watermill-nats's
// nats.SubscriberConfig{Unmarshaler: natskeys.Unmarshaler{}}), and a
// message's key is "<stream>/<sequence>"; a message from anywhere else has
// no key, and is rejected as a permanent failure.
func ExampleSequence() {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	r, err := receiver.New(st).WithKeyGenerator(natskeys.Sequence()).Build()
	if err != nil {
		panic(err)
	}
	_ = r // router.AddMiddleware(r.Middleware) on a watermill-nats subscriber

	msg := message.NewMessage("m-1", nil)
	msg.Metadata.Set("nats_stream", "payments") // as natskeys.Unmarshaler sets them
	msg.Metadata.Set("nats_stream_seq", "42")
	key, _ := natskeys.Sequence().Key(msg)
	fmt.Println(key)

	_, err = natskeys.Sequence().Key(message.NewMessage("m-2", nil))
	fmt.Println(err)
	// Output:
	// payments/42
	// oncemill: no key: metadata field is missing or empty: nats_stream and nats_stream_seq (not read through natskeys.Unmarshaler from a JetStream consumer)
}
