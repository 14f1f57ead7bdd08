package main

// Fault injection for the integration tests (--hold-before-ack): stop one
// delivery between its effect and its ack, so that a test can kill the
// process exactly there.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// holdLimit bounds the hold: a process nobody kills exits on its own.
const holdLimit = 10 * time.Minute

// holdBeforeAck is the outermost middleware. When the handler chain has
// succeeded for a command of paymentID, oncemill has recorded the outcome
// (in the one-transaction mode: committed it with the effect), and the router has
// neither published the produced messages nor acked the delivery. There it
// prints
//
//	hold: uuid=<delivery UUID> produced=<UUID>,<UUID>
//
// on out and blocks, so the test can SIGKILL the process at that point.
func holdBeforeAck(paymentID string, out io.Writer) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			msgs, err := h(msg)
			if err != nil || paymentID == "" || paymentIDOf(msg) != paymentID {
				return msgs, err
			}
			produced := make([]string, len(msgs))
			for i, m := range msgs {
				produced[i] = m.UUID
			}
			fmt.Fprintf(out, "hold: uuid=%s produced=%s\n", msg.UUID, strings.Join(produced, ","))
			time.Sleep(holdLimit)
			fmt.Fprintf(os.Stderr, "oncemill-soak: held %v and nobody killed the process; exiting\n", holdLimit)
			os.Exit(3)
			return msgs, err
		}
	}
}

// paymentIDOf reads the payment_id of a command, or "" if it has none.
func paymentIDOf(msg *message.Message) string {
	var cmd struct {
		PaymentID string `json:"payment_id"`
	}
	_ = json.Unmarshal(msg.Payload, &cmd)
	return cmd.PaymentID
}
