package worker

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// newSQS connects to SQS (or an emulator at --sqs-endpoint) through
// watermill-aws. Each topic is a standard queue that the workers share. A
// nacked message is not deleted: SQS hands it out again once the queue's
// VisibilityTimeout has passed.
func newSQS(cfg Config, logger watermill.LoggerAdapter) (*Broker, error) {
	awsCfg := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider(Env("AWS_ACCESS_KEY_ID", "test"), Env("AWS_SECRET_ACCESS_KEY", "test"), ""),
	}
	endpoint := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(cfg.SQSEndpoint) }}
	queue := wsqs.QueueConfigAttributes{
		VisibilityTimeout: strconv.Itoa(int(cfg.SQSVisibilityTimeout.Seconds())),
	}
	pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{
		AWSConfig:         awsCfg,
		OptFns:            endpoint,
		CreateQueueConfig: queue,
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("sqs publisher (%s): %w", cfg.SQSEndpoint, err)
	}
	newSub := func() (*wsqs.Subscriber, error) {
		return wsqs.NewSubscriber(wsqs.SubscriberConfig{
			AWSConfig:             awsCfg,
			OptFns:                endpoint,
			QueueConfigAttributes: queue,
			// Each receiver takes one message at a time and waits for its
			// ack; concurrency comes from several receivers per queue.
			ConsumeWorkers: cfg.SQSWorkers,
		}, logger)
	}
	b := &Broker{System: semconv.MessagingSystemAWSSQS, Pub: pub, Closers: []func() error{pub.Close}}
	b.Subscriber = func(string) (message.Subscriber, error) { return newSub() }
	b.InitTopics = func(ctx context.Context, names []string) error {
		sub, err := newSub()
		if err != nil {
			return fmt.Errorf("sqs subscriber: %w", err)
		}
		defer sub.Close()
		for _, name := range names {
			if err := sub.SubscribeInitializeWithContext(ctx, name); err != nil {
				return fmt.Errorf("create sqs queue %s at %s: %w", name, cfg.SQSEndpoint, err)
			}
		}
		return nil
	}
	return b, nil
}
