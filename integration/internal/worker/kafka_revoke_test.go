package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// chain is a delivery as NewRouter wires it on Kafka: endOnRevoke outside,
// a stand-in for oncemill's receiver (it runs the handler, then pauses on
// the message's context before its nack, as the attempt pause does), and
// markHandlerRunning around the handler.
func revokeChain(sess context.Context, handler message.HandlerFunc) message.HandlerFunc {
	pausing := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				select {
				case <-msg.Context().Done():
				case <-time.After(time.Minute):
				}
			}
			return out, err
		}
	}
	inner := pausing(markHandlerRunning(handler))
	return func(msg *message.Message) ([]*message.Message, error) { return endWithSession(sess, inner, msg) }
}

func TestEndOnRevokeEndsThePauseNotTheHandler(t *testing.T) {
	sess, revoke := context.WithCancelCause(context.Background())
	running, release := make(chan struct{}), make(chan struct{})
	var canceledWhileRunning bool
	h := revokeChain(sess, func(msg *message.Message) ([]*message.Message, error) {
		close(running)
		<-release
		canceledWhileRunning = msg.Context().Err() != nil
		return nil, errors.New("database down")
	})
	done := make(chan error, 1)
	go func() {
		_, err := h(message.NewMessage(watermill.NewUUID(), nil))
		done <- err
	}()
	<-running
	revoke(sarama.ErrRebalanceInProgress)
	time.Sleep(50 * time.Millisecond)
	close(release)
	select {
	case err := <-done:
		if err == nil {
			t.Error("the failed delivery was acked")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pause after the handler did not end when the partition was revoked")
	}
	if canceledWhileRunning {
		t.Error("the handler's context was canceled while it ran")
	}
}

func TestEndOnRevokeAcksAResendWithoutRunningIt(t *testing.T) {
	sess, revoke := context.WithCancelCause(context.Background())
	revoke(sarama.ErrRebalanceInProgress)
	ran := false
	out, err := revokeChain(sess, func(*message.Message) ([]*message.Message, error) {
		ran = true
		return nil, nil
	})(message.NewMessage(watermill.NewUUID(), nil))
	if ran || err != nil || out != nil {
		t.Errorf("ran=%v out=%v err=%v: want the resend acked without running", ran, out, err)
	}
}

func TestEndOnRevokeLeavesShutdownToTheDrain(t *testing.T) {
	sess, cancel := context.WithCancel(context.Background())
	cancel() // the subscriber closes: no cause
	var ctxErr error
	_, err := revokeChain(sess, func(msg *message.Message) ([]*message.Message, error) {
		ctxErr = msg.Context().Err()
		return nil, nil
	})(message.NewMessage(watermill.NewUUID(), nil))
	if err != nil || ctxErr != nil {
		t.Errorf("err=%v, handler's context %v: a shutdown must let the delivery run", err, ctxErr)
	}
}
