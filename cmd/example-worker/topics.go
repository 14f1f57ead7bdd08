package main

import "fmt"

// topics names the worker's topics (Kafka topics, AMQP queues, SQS queues).
// Names use letters, digits, '-' and '_' only, which every broker accepts
// (SQS refuses dots).
type topics struct {
	prefix string
}

// payments is the topic of partition i's commands.
func (t topics) payments(partition int) string {
	return fmt.Sprintf("%spayments-%d", t.prefix, partition)
}

// settlements receives the payment.settled events the handler produces.
func (t topics) settlements() string { return t.prefix + "settlements" }

// deadLetters receives the commands that will never be processed (cached
// failures and rejected messages), once each.
func (t topics) deadLetters() string { return t.prefix + "dead-letters" }

// all lists every topic of a worker with the given partitions.
func (t topics) all(partitions int) []string {
	out := []string{t.settlements(), t.deadLetters()}
	for i := range partitions {
		out = append(out, t.payments(i))
	}
	return out
}
