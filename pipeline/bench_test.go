package pipeline_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store/memory"
)

var benchPayload = []byte(`{"payment_id":"p-000123","account":"acc-17","amount_cents":1234,"currency":"EUR","meta":{"sent_at":"2026-11-21T10:00:00Z","attempt":1}}`)

func benchStage(b *testing.B) *pipeline.Idempotency {
	b.Helper()
	st, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	stage, err := pipeline.NewIdempotency(pipeline.IdempotencyConfig{Store: st, Keys: keygen.UUID(), Scope: "bench", Policy: policy.Default()})
	if err != nil {
		b.Fatal(err)
	}
	return stage
}

// BenchmarkRouterThroughput runs the same router on gochannel bare, with
// oncemill, and with Watermill's Deduplicator, in one process. Each message
// is unique, so oncemill executes every one: this is its full cost.
func BenchmarkRouterThroughput(b *testing.B) {
	b.Run("bare", func(b *testing.B) { benchRouter(b, nil) })
	b.Run("oncemill", func(b *testing.B) { benchRouter(b, benchStage(b).Middleware) })
	b.Run("deduplicator", func(b *testing.B) {
		d := &middleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}
		benchRouter(b, d.Middleware)
	})
}

func benchRouter(b *testing.B, mw message.HandlerMiddleware) {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(b.N)}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		b.Fatal(err)
	}
	var handled atomic.Int64
	done := make(chan struct{})
	n := int64(b.N)
	h := router.AddConsumerHandler("bench", "in", pubSub, func(*message.Message) error {
		if handled.Add(1) == n {
			close(done)
		}
		return nil
	})
	if mw != nil {
		h.AddMiddleware(mw)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = router.Run(ctx); close(stopped) }()
	<-router.Running()

	msgs := make([]*message.Message, b.N)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), benchPayload)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, m := range msgs {
		if err := pubSub.Publish("in", m); err != nil {
			b.Fatal(err)
		}
	}
	<-done
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	cancel()
	<-stopped
	_ = pubSub.Close()
}

// BenchmarkReplay is the whole duplicate path of the stage: key, fingerprint,
// Begin finding a success, decoding the stored message, handing it back.
func BenchmarkReplay(b *testing.B) {
	stage := benchStage(b)
	handler := stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("settled-1", []byte(`{"status":"settled"}`))}, nil
	})
	m := message.NewMessage("m-1", benchPayload)
	if _, err := handler(m); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, err := handler(m)
		if err != nil || len(out) != 1 {
			b.Fatal(out, err)
		}
	}
}

// BenchmarkExecute is the stage around a handler that does nothing, for a
// new key each time: Begin, lease context, heartbeat timer, Complete.
func BenchmarkExecute(b *testing.B) {
	stage := benchStage(b)
	handler := stage.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	msgs := make([]*message.Message, b.N)
	for i := range msgs {
		msgs[i] = message.NewMessage("m-"+strconv.Itoa(i), benchPayload)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, m := range msgs {
		if _, err := handler(m); err != nil {
			b.Fatal(err)
		}
	}
}
