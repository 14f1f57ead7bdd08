package receiver_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

// Nothing dropped in silence: with the builder's defaults and no logger, a
// message whose key cannot be computed is rejected with one error line on
// slog.Default() that names the key generator's error.
func TestNoLoggerStillLogsARejectionThroughSlogDefault(t *testing.T) {
	logs := testenv.CaptureDefault(t) // not parallel: it replaces slog.Default()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys, err := keygen.Metadata("Idempotency-Key")
	if err != nil {
		t.Fatal(err)
	}
	r, err := receiver.New(st).WithKeyGenerator(keys).Build()
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
	if _, err := h(message.NewMessage("order-1", []byte(`{"amount":"12.00"}`))); err != nil {
		t.Fatalf("a message without a key must be acked, got %v", err)
	}
	if ran {
		t.Fatal("the handler ran for a message without a key")
	}
	errs := logs.At(slog.LevelError)
	if len(errs) != 1 {
		t.Fatalf("error lines %+v, want exactly 1", errs)
	}
	l := errs[0]
	lerr, _ := l.Attrs["error"].(error)
	const want = `metadata field is missing or empty: "Idempotency-Key"`
	if lerr == nil || !strings.Contains(lerr.Error(), want) || !errors.Is(lerr, keygen.ErrNoKey) {
		t.Fatalf("error line %+v: its error %v does not name the key generator's error %q", l, lerr, want)
	}
	if l.Msg != "Message rejected as a permanent failure; it is acked and not run" || l.Attrs["message_uuid"] != "order-1" {
		t.Fatalf("error line %+v, want the rejection of order-1", l)
	}
}
