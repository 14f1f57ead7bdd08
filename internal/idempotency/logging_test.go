package idempotency_test

import (
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/policy"
)

// A ClaimLease that fails logs one error line per delivery, with the store's
// error and the delivery's fields, before the nack.
func TestStoreFailureIsLogged(t *testing.T) {
	t.Parallel()
	logs, logger := testenv.NewLogs()
	h := newHarness(t, func(c *stageConfig) {
		c.Store, c.Logger = &failingStore{Store: c.Store, failBegin: true}, logger
	})
	handler := h.stage.Middleware(produce(new(atomic.Int32)))
	for range 2 {
		if _, err := handler(msg("m1", "x")); !errors.Is(err, errStoreDown) {
			t.Fatalf("got %v, want a nack wrapping the store error", err)
		}
	}
	errs := logs.At(slog.LevelError)
	if len(errs) != 2 {
		t.Fatalf("error lines %+v, want one per failed delivery (2)", errs)
	}
	for _, l := range errs {
		err, _ := l.Attrs["error"].(error)
		if !strings.Contains(l.Msg, "store could not decide") || !errors.Is(err, errStoreDown) ||
			l.Attrs["message_uuid"] != "m1" || l.Attrs["scope"] != "test" || l.Attrs["key"] != "m1" {
			t.Fatalf("error line %+v, want the store failure with its error and the delivery's fields", l)
		}
	}
}

// A dead letter that cannot be forwarded is logged at error level, with the
// publisher's error, whether the message was rejected or failed for good.
func TestDeadLetterFailureIsLogged(t *testing.T) {
	t.Parallel()
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer pubSub.Close()
	pub := &failingPublisher{Publisher: pubSub}
	pub.fail.Store(2)
	logs, logger := testenv.NewLogs()
	h := newHarness(t, func(c *stageConfig) {
		c.DeadLetterPublisher, c.DeadLetterTopic, c.Logger = pub, "dead", logger
		c.Policy.MaxPayloadBytes = 4
	})
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, policy.Cached(errDeclined)
	})
	if _, err := handler(msg("m1", "too large")); err == nil {
		t.Fatal("a rejection whose forward failed must nack")
	}
	if _, err := handler(msg("m2", "x")); err == nil {
		t.Fatal("a cached failure whose forward failed must nack")
	}
	errs := logs.At(slog.LevelError)
	if len(errs) != 2 {
		t.Fatalf("error lines %+v, want one per failed forward (2)", errs)
	}
	for i, uuid := range []string{"m1", "m2"} {
		l := errs[i]
		err, _ := l.Attrs["error"].(error)
		if !strings.Contains(l.Msg, "dead-letter topic failed") || err == nil || !strings.Contains(err.Error(), "broker unavailable") ||
			l.Attrs["message_uuid"] != uuid {
			t.Fatalf("error line %d: %+v, want the failed forward of %s with the publisher's error", i, l, uuid)
		}
	}
}

// Validation logs a dead letter it could not forward, too.
func TestValidationDeadLetterFailureIsLogged(t *testing.T) {
	t.Parallel()
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer pubSub.Close()
	pub := &failingPublisher{Publisher: pubSub}
	pub.fail.Store(1)
	logs, logger := testenv.NewLogs()
	h := newHarness(t, func(c *stageConfig) {
		c.Validation = func(*message.Message) error { return errors.New("no amount") }
		c.DeadLetterPublisher, c.DeadLetterTopic, c.Logger = pub, "dead", logger
	})
	if _, err := h.stage.Middleware(produce(new(atomic.Int32)))(msg("m1", "x")); err == nil {
		t.Fatal("an invalid message whose forward failed must nack")
	}
	errs := logs.At(slog.LevelError)
	if len(errs) != 1 {
		t.Fatalf("error lines %+v, want 1", errs)
	}
	if l := errs[0]; !strings.Contains(l.Msg, "dead-letter topic failed") || l.Attrs["message_uuid"] != "m1" || l.Attrs["reason"] != "no amount" {
		t.Fatalf("error line %+v", l)
	}
}
