package oncemilltest

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// DuplicatingMiddleware is a Watermill middleware that handles every message
// times times in a row: the message itself, then copies with the same UUID,
// payload, metadata and context, each a delivery of its own, as a broker's
// redeliveries are. It is for integration tests: real duplicates through a
// real router, where the handler's idempotency shows.
//
// Put it outside the receiver, so that the receiver sees every copy: add it
// before r.Middleware (Watermill runs the middleware added first outermost,
// router and handler middleware alike, in the order they were added):
//
//	router.AddMiddleware(oncemilltest.DuplicatingMiddleware(2))
//	handler := router.AddConsumerHandler(...)
//	handler.AddMiddleware(r.Middleware)
//
// Inside the receiver it would run the handler twice under one lease, which
// tests nothing.
//
// The first error ends the message: it is returned at once and the router
// nacks, and the broker's redelivery is duplicated again. Otherwise the
// messages the copies produced are returned together: the router publishes
// the replayed ones again, with their stored UUIDs, as it does after a real
// redelivery, so consumers downstream see duplicates too. Unlike Watermill's
// middleware.Duplicator, each copy is a message of its own, and times is
// yours to choose. It panics if times is below 1.
func DuplicatingMiddleware(times int) message.HandlerMiddleware {
	if times < 1 {
		panic(fmt.Sprintf("oncemill: oncemilltest: DuplicatingMiddleware(%d): a message is handled at least once", times))
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			produced, err := h(msg)
			if err != nil {
				return nil, err
			}
			for range times - 1 {
				more, err := h(redelivery(msg))
				if err != nil {
					return nil, err
				}
				produced = append(produced, more...)
			}
			return produced, nil
		}
	}
}
