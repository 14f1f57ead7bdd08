package keygen_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/keygen"
)

func TestMetadata(t *testing.T) {
	t.Parallel()
	withMeta := func(md message.Metadata) *message.Message {
		msg := message.NewMessage("uuid-1", []byte(`{}`))
		msg.Metadata = md
		return msg
	}
	tests := []struct {
		name    string
		msg     *message.Message
		want    string
		wantErr bool
	}{
		{name: "present", msg: withMeta(message.Metadata{"Idempotency-Key": "pay-7", "other": "x"}), want: "pay-7"},
		{name: "missing", msg: withMeta(message.Metadata{"other": "x"}), wantErr: true},
		{name: "empty value", msg: withMeta(message.Metadata{"Idempotency-Key": ""}), wantErr: true},
		{name: "nil metadata", msg: withMeta(nil), wantErr: true},
		{name: "case matters", msg: withMeta(message.Metadata{"idempotency-key": "pay-7"}), wantErr: true},
	}
	g, err := keygen.Metadata("Idempotency-Key")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := g.Key(tt.msg)
			if !tt.wantErr {
				if err != nil || got != tt.want {
					t.Fatalf("Key = %q, %v; want %q", got, err, tt.want)
				}
				return
			}
			if !strings.Contains(err.Error(), `"Idempotency-Key"`) {
				t.Errorf("error %q does not name the field", err)
			}
			if !errors.Is(err, keygen.ErrMissingMetadata) || !errors.Is(err, keygen.ErrNoKey) {
				t.Errorf("err = %v, want ErrMissingMetadata and ErrNoKey", err)
			}
		})
	}

	if _, err := g.Key(nil); !errors.Is(err, keygen.ErrNoKey) {
		t.Errorf("nil message: err = %v, want ErrNoKey", err)
	}
}

func TestMetadataEmptyFieldName(t *testing.T) {
	t.Parallel()
	g, err := keygen.Metadata("")
	if !errors.Is(err, oncemill.ErrInvalidConfig) || g != nil {
		t.Fatalf("Metadata(\"\") = %v, %v; want nil, ErrInvalidOptions", g, err)
	}
}
