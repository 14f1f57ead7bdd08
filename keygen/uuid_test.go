package keygen_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
)

func TestUUID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		msg     *message.Message
		want    string
		wantErr error
	}{
		{name: "uuid", msg: message.NewMessage("8c2f0b1e-5d1a-4a34-9a57-0f8a4a5c2f10", nil), want: "8c2f0b1e-5d1a-4a34-9a57-0f8a4a5c2f10"},
		{name: "any string", msg: message.NewMessage("order-42", []byte(`{}`)), want: "order-42"},
		{name: "empty", msg: message.NewMessage("", []byte(`{}`)), wantErr: keygen.ErrEmptyKey},
		{name: "nil message", msg: nil, wantErr: keygen.ErrNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := keygen.UUID().Key(tt.msg)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !errors.Is(err, keygen.ErrNoKey) {
					t.Fatalf("err = %v, want %v wrapping ErrNoKey", err, tt.wantErr)
				}
				if got != "" {
					t.Errorf("key = %q with an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Key = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestUUIDDoesNotAllocate(t *testing.T) {
	msg := message.NewMessage("8c2f0b1e-5d1a-4a34-9a57-0f8a4a5c2f10", []byte(`{}`))
	empty := message.NewMessage("", nil)
	var sink string
	allocs := testing.AllocsPerRun(1000, func() {
		g := keygen.UUID()
		sink, _ = g.Key(msg)
		_, _ = g.Key(empty)
	})
	if allocs != 0 {
		t.Errorf("UUID: %v allocations per run, want 0", allocs)
	}
	_ = sink
}
