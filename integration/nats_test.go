package integration

// What JetStream itself de-duplicates and where it stops delivering, as
// docs/nats.md describes it.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	rig "github.com/oncemill/oncemill/integration/internal/worker"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/redisstore"
)

// Nats-Msg-Id (watermill-nats's TrackMsgId: the Watermill UUID) makes the
// stream drop a re-publish of the same UUID within its duplicate window, 2
// minutes unless set; a re-publish after the window is stored again, and a
// redelivery is not a publish at all (TestScenarios/nats/…/3_… replays it).
func TestNATSMsgIDDeduplicatesWithinTheWindowOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, brokerKindNamed(t, "nats"), storeKinds[1])
	js := natsJS(t)
	defaults, short := h.ns+"-default-window", h.ns+"-short-window"
	t.Cleanup(func() { h.broker.cleanup(t, []string{defaults, short}) })
	must(t, rig.EnsureNATSStream(js, defaults)) // the worker's streams
	info, err := js.StreamInfo(defaults)
	must(t, err)
	if info.Config.Duplicates != 2*time.Minute {
		t.Errorf("the worker's stream has a duplicate window of %v, want JetStream's default 2m", info.Config.Duplicates)
	}
	if err := pub0(t).Publish(h.ns+"-no-stream", message.NewMessage(watermill.NewUUID(), nil)); err == nil {
		t.Error("a publish to a subject without a stream succeeded, want an error")
	}
	const window = time.Second
	_, err = js.AddStream(&nats.StreamConfig{Name: short, Subjects: []string{short}, Duplicates: window})
	must(t, err)

	pub, err := wnats.NewPublisher(wnats.PublisherConfig{URL: env.natsURL, JetStream: wnats.JetStreamConfig{TrackMsgId: true}}, logger())
	must(t, err)
	defer pub.Close()
	m := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"p-1"}`))
	for range 2 {
		must(t, pub.Publish(short, again(m)))
	}
	stored := func() uint64 {
		info, err := js.StreamInfo(short)
		must(t, err)
		return info.State.Msgs
	}
	if n := stored(); n != 1 {
		t.Fatalf("%d messages stored after publishing one UUID twice within the window, want 1", n)
	}
	time.Sleep(window + 500*time.Millisecond)
	must(t, pub.Publish(short, again(m)))
	if n := stored(); n != 2 {
		t.Fatalf("%d messages stored after a re-publish past the window, want 2: the stream keeps it again", n)
	}
}

// MaxDeliver below oncemill's MaxAttempts: JetStream stops delivering a
// failing message after MaxDeliver deliveries, before oncemill's last
// attempt could dead-letter it, and nothing says so to the handler.
func TestNATSMaxDeliverBelowMaxAttemptsStopsBeforeTheDeadLetter(t *testing.T) {
	t.Parallel()
	h := newHarness(t, brokerKindNamed(t, "nats"), storeKinds[1])
	topic, dlTopic := h.ns+"-in", h.ns+"-dead"
	t.Cleanup(func() {
		h.broker.cleanup(t, []string{topic, dlTopic})
		storeKindNamed(t, "redis").cleanup(t, h.ns)
	})
	st, err := redisstore.New(redisClient(t), redisstore.Options{Prefix: h.ns})
	must(t, err)
	t.Cleanup(func() { _ = st.Close() })
	rc, err := receiver.New(st).WithScope("maxdeliver").WithPolicy(poisonShort).WithDeadLetter(h.pub, dlTopic).Build()
	must(t, err)
	const maxDeliver = 3
	sub, err := rig.NewNATSSubscriber(rig.NATSSettings{URL: env.natsURL, AckWait: natsAckWait, MaxDeliver: maxDeliver, MaxAckPending: 1}, h.ns, logger())
	must(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	dead := h.observe(dlTopic)

	var mu sync.Mutex
	runs := 0
	startRouter(t, topic, sub, rc.Middleware, func(*message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		runs++
		return errors.New("gateway timeout") // retryable, every time
	})
	h.publishTo(topic, message.NewMessage(watermill.NewUUID(), []byte(`{"cents":100}`)))
	count := func() int { mu.Lock(); defer mu.Unlock(); return runs }
	eventually(t, limit, func() bool { return count() >= maxDeliver }, func() string { return "the handler never ran MaxDeliver times" })
	// The schedule's pauses (poisonShort) are at most 3.3 s for all five
	// attempts; watch past that and past an AckWait.
	time.Sleep(natsAckWait + 2*time.Second)
	if n := count(); n != maxDeliver {
		t.Errorf("the handler ran %d times, want MaxDeliver = %d (oncemill's MaxAttempts is %d)", n, maxDeliver, policy.Policy{}.WithDefaults().MaxAttempts)
	}
	if n := len(dead.received()); n != 0 {
		t.Errorf("%d dead letters, want none: JetStream stopped before the last attempt", n)
	}
}

// watermill-nats gives up on a delivery the router has not acked within
// its AckWaitTimeout. Without nats.ManualAck, nats.go then acks it (its
// auto-ack after the callback returns): the message is gone though nothing
// handled it. With ManualAck (the worker's subscriber), JetStream delivers
// it again after AckWait.
func TestNATSManualAckKeepsAMessageWatermillGaveUpOn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, brokerKindNamed(t, "nats"), storeKinds[1])
	js := natsJS(t)
	for _, manual := range []bool{false, true} {
		topic := fmt.Sprintf("%s-manual-%t", h.ns, manual)
		t.Cleanup(func() { h.broker.cleanup(t, []string{topic}) })
		must(t, rig.EnsureNATSStream(js, topic))
		const ackWait = 2 * time.Second
		_, err := js.AddConsumer(topic, &nats.ConsumerConfig{Durable: "d", DeliverSubject: "deliver." + topic, DeliverGroup: "d",
			AckPolicy: nats.AckExplicitPolicy, AckWait: ackWait, FilterSubject: topic})
		must(t, err)
		var opts []nats.SubOpt
		if manual {
			opts = append(opts, nats.ManualAck())
		}
		sub, err := wnats.NewSubscriber(wnats.SubscriberConfig{URL: env.natsURL, QueueGroupPrefix: "d", AckWaitTimeout: 500 * time.Millisecond,
			JetStream: wnats.JetStreamConfig{SubscribeOptions: opts, DurablePrefix: "d"}}, logger())
		must(t, err)
		h.publishTo(topic, message.NewMessage(watermill.NewUUID(), []byte("{}")))
		ch, err := sub.Subscribe(context.Background(), topic)
		must(t, err)
		deliveries := 0
		timeout := time.After(ackWait + 2*time.Second)
	wait:
		for {
			select {
			case <-ch: // neither acked nor nacked: the router is slow
				deliveries++
			case <-timeout:
				break wait
			}
		}
		_ = sub.Close()
		want := 1
		if manual {
			want = 2 // again after AckWait
		}
		if deliveries != want {
			t.Errorf("ManualAck %t: %d deliveries of a message never acked, want %d", manual, deliveries, want)
		}
	}
}

// A durable consumer that nats.go creates itself (watermill-nats
// subscribing to a topic that has none) is deleted when the subscriber
// closes, and the group's position with it; one the application created
// (the worker's NewNATSSubscriber) stays.
func TestNATSConsumerCreatedByNATSGoIsDeletedOnClose(t *testing.T) {
	t.Parallel()
	h := newHarness(t, brokerKindNamed(t, "nats"), storeKinds[1])
	js := natsJS(t)
	for _, own := range []bool{false, true} {
		topic := fmt.Sprintf("%s-own-%t", h.ns, own)
		t.Cleanup(func() { h.broker.cleanup(t, []string{topic}) })
		must(t, rig.EnsureNATSStream(js, topic))
		var sub message.Subscriber
		var err error
		if own {
			sub, err = rig.NewNATSSubscriber(rig.NATSSettings{URL: env.natsURL, AckWait: natsAckWait, MaxDeliver: -1, MaxAckPending: 1}, "d", logger())
		} else {
			sub, err = wnats.NewSubscriber(wnats.SubscriberConfig{URL: env.natsURL, QueueGroupPrefix: "d",
				JetStream: wnats.JetStreamConfig{SubscribeOptions: []nats.SubOpt{nats.ManualAck()}, DurablePrefix: "d"}}, logger())
		}
		must(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		_, err = sub.Subscribe(ctx, topic)
		must(t, err)
		info, err := js.ConsumerInfo(topic, "d")
		if err != nil {
			t.Fatalf("own %t: no consumer while subscribed: %v", own, err)
		}
		if !own && info.Config.AckWait != 30*time.Second {
			t.Errorf("nats.go's consumer has AckWait %v, want JetStream's default 30s", info.Config.AckWait)
		}
		cancel()
		must(t, sub.Close())
		_, err = js.ConsumerInfo(topic, "d")
		if gone := errors.Is(err, nats.ErrConsumerNotFound); gone == own {
			t.Errorf("created by the application %t: consumer after Close: %v; want it kept only when the application created it", own, err)
		}
	}
}

// pub0 is watermill-nats's publisher without the harness's stream creation.
func pub0(t *testing.T) message.Publisher {
	pub, err := rig.NewNATSPublisher(env.natsURL, logger())
	must(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}
