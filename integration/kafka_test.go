package integration

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// startKafka starts an in-memory Kafka cluster on a free port of 127.0.0.1.
// Its smallest accepted session timeout is 1 s (Kafka's and kfake's default
// is 6 s), so that a crashed worker's partitions move to another worker
// after the 2 s session timeout the scenarios configure.
func startKafka() (*kfake.Cluster, error) {
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.GroupMinSessionTimeout(time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("starting kfake: %w", err)
	}
	return c, nil
}
