package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/examples/internal/exampletest"
)

// TestSQSPostgres runs the program in process against an SQS emulator
// (fauxqs) and PostgreSQL, publishes its demo orders (three, one of them
// twice, and one that can never be booked), and checks one row per order
// and none for the bad one.
func TestSQSPostgres(t *testing.T) {
	pool, schema := exampletest.Postgres(t)
	cfg := config{
		SQSEndpoint: exampletest.SQS(t),
		Region:      "us-east-1",
		Queue:       exampletest.Name("oncemill-example-orders-"),
		DatabaseURL: exampletest.PostgresDSN,
		Schema:      schema,
	}
	awsCfg := aws.Config{Region: cfg.Region, Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}
	endpoint := func(o *sqs.Options) { o.BaseEndpoint = aws.String(cfg.SQSEndpoint) }
	t.Cleanup(func() { deleteQueue(t, sqs.NewFromConfig(awsCfg, endpoint), cfg.Queue) })

	// The test publishes before the program starts; the publisher creates
	// the queue, with the program's attributes.
	pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{
		AWSConfig: awsCfg, OptFns: []func(*sqs.Options){endpoint},
		CreateQueueConfig: wsqs.QueueConfigAttributes{VisibilityTimeout: "30"},
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := demoOrders()
	if err := pub.Publish(cfg.Queue, msgs...); err != nil {
		t.Fatal(err)
	}
	books, bad := msgs[0], msgs[4]
	if msgs[1] != books {
		t.Fatal("demoOrders changed: the test expects the books order twice first, and the bad one last")
	}

	log := &exampletest.Log{}
	prog := exampletest.Start(t, log, func(ctx context.Context) error {
		return run(ctx, cfg, slog.New(slog.NewTextHandler(log, nil)))
	})
	exampletest.Eventually(t, 60*time.Second, log, "3 orders executed, 1 replayed and 1 failure cached", func() (bool, error) {
		return log.Count("outcome=executed") == 3 && log.Count("outcome=replayed") == 1 &&
			log.Count("outcome=cached_failure\n") == 1, prog.Exited()
	})
	if n := log.Count("outcome=replayed", "uuid="+books.UUID); n != 1 {
		exampletest.Fatalf(t, log, "the duplicate books order replayed %d times, want 1", n)
	}
	if n := log.Count("outcome=cached_failure\n", "uuid="+bad.UUID); n != 1 {
		exampletest.Fatalf(t, log, "the bad order's failure cached %d times, want 1", n)
	}
	exampletest.ExactlyOnce(t, exampletest.CountRows(t, pool, pgx.Identifier{schema, "orders"}.Sanitize()),
		books.UUID, msgs[2].UUID, msgs[3].UUID)

	prog.Stop()
}

func deleteQueue(t *testing.T, client *sqs.Client, queue string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	if err == nil {
		_, err = client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
	}
	if err != nil {
		t.Errorf("deleting queue %s: %v", queue, err)
	}
}
