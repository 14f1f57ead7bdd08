package receiver_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

// Bad input gets a clear error classified permanent: the message is acked
// (never redelivered forever), the handler never runs, nothing panics, and
// the rejection is reported on the event, so nothing disappears unseen.
func TestBadInputIsRejectedClearlyAndPermanently(t *testing.T) {
	t.Parallel()
	strictJSON, err := keygen.ContentHash(keygen.ContentHashOptions{RejectNonJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := keygen.Metadata("tenant_id")
	if err != nil {
		t.Fatal(err)
	}
	tenMB := bytes.Repeat([]byte("a"), 10<<20)

	cases := []struct {
		name    string
		keys    keygen.Generator
		msg     *message.Message
		is      error
		message string // part of the error a person reads
	}{
		{"empty UUID", keygen.UUID(), message.NewMessage("", []byte(`{}`)), keygen.ErrEmptyKey, "UUID"},
		{"missing metadata field", tenant, message.NewMessage("m1", []byte(`{}`)), keygen.ErrMissingMetadata, "tenant_id"},
		{"malformed JSON", strictJSON, message.NewMessage("m1", []byte(`{"amount": 12,}`)), keygen.ErrNotJSON, "JSON"},
		{"non-UTF-8", strictJSON, message.NewMessage("m1", []byte("{\"name\":\"\xff\xfe\"}")), keygen.ErrNotJSON, "UTF-8"},
		{"10 MB payload", keygen.UUID(), message.NewMessage("m1", tenMB), pipeline.ErrPayloadTooLarge, "10485760 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, err := memory.New(memory.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var events []pipeline.Event
			r, err := receiver.New(st).WithKeyGenerator(tc.keys).WithScope("s").
				WithEventHandler(func(e pipeline.Event) { events = append(events, e) }).Build()
			if err != nil {
				t.Fatal(err)
			}
			calls := 0
			out, err := r.Middleware(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })(tc.msg)
			if err != nil || out != nil {
				t.Fatalf("got (%v, %v); a permanent rejection is acked with nothing produced", out, err)
			}
			if calls != 0 || len(events) != 1 {
				t.Fatalf("handler ran %d times, %d events; want 0 and 1", calls, len(events))
			}
			e := events[0]
			if e.Outcome != pipeline.OutcomeRejected || !e.Outcome.Acked() {
				t.Fatalf("outcome %v, want rejected", e.Outcome)
			}
			if !errors.Is(e.Err, tc.is) || !((policy.Policy{}).Classify(e.Err) == policy.ClassCached) {
				t.Fatalf("error %v: want errors.Is %v and classified permanent", e.Err, tc.is)
			}
			if !strings.Contains(e.Err.Error(), tc.message) {
				t.Fatalf("error %q does not say %q", e.Err, tc.message)
			}
		})
	}
}
