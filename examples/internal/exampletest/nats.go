package exampletest

import (
	"cmp"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// NATSURL is the NATS server with JetStream, as the examples' default,
// overridden by the variable the repository's other tests read.
var NATSURL = cmp.Or(os.Getenv("ONCEMILL_NATS_URL"), "nats://127.0.0.1:4222")

// NATS checks that NATS answers with JetStream on, failing the test if it
// does not, and deletes stream (with its consumers) when the test ends.
func NATS(t *testing.T, stream string) {
	t.Helper()
	connect := func() (*nats.Conn, nats.JetStreamContext) {
		t.Helper()
		nc, err := nats.Connect(NATSURL, nats.Timeout(5*time.Second))
		if err == nil {
			var js nats.JetStreamContext
			if js, err = nc.JetStream(); err == nil {
				if _, err = js.AccountInfo(); err == nil {
					return nc, js
				}
			}
			nc.Close()
		}
		t.Fatalf("NATS with JetStream at %s does not answer (%v); start it with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server, or set ONCEMILL_NATS_URL", NATSURL, err)
		return nil, nil
	}
	nc, _ := connect()
	nc.Close()
	t.Cleanup(func() {
		nc, js := connect()
		defer nc.Close()
		if err := js.DeleteStream(stream); err != nil && !errors.Is(err, nats.ErrStreamNotFound) {
			t.Errorf("deleting stream %s: %v", stream, err)
		}
	})
}
