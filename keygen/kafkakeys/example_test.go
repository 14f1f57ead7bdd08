package kafkakeys_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen/kafkakeys"
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
