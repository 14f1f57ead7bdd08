// Command kfake runs an in-memory Kafka cluster (franz-go's kfake) on one
// address, for running the example worker by hand on a machine without
// Kafka (scripts/brokers starts it). It speaks the Kafka protocol, consumer
// groups and offset commits included, and keeps nothing on disk.
//
//	go run ./integration/cmd/kfake --port=9092
//
// kfake binds and advertises 127.0.0.1 only.
//
// It prints "kfake listening on ADDR" once it accepts connections, and stops
// on SIGTERM or SIGINT.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	port := flag.Int("port", 9092, "port to listen on, on 127.0.0.1")
	partitions := flag.Int("partitions", 1, "partitions of auto-created topics")
	minSession := flag.Duration("min-session-timeout", time.Second, "smallest consumer group session timeout accepted (Kafka's default is 6s)")
	flag.Parse()

	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.Ports(*port),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(*partitions),
		kfake.GroupMinSessionTimeout(*minSession),
	)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kfake: %v\n", err)
		os.Exit(1)
	}
	defer c.Close()
	fmt.Println("kfake listening on", c.ListenAddrs()[0])

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	<-stop
}
