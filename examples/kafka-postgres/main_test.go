package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/oncemill/oncemill/examples/internal/exampletest"
)

// TestMain lets the test run the program as a real process: the test binary
// started with EXAMPLE_RUN_MAIN=1 runs main instead of the tests, so the
// signal handling and the exit code are main's own (and the child is built
// with the test's flags, -race included).
func TestMain(m *testing.M) {
	if os.Getenv("EXAMPLE_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var healthzAddr = regexp.MustCompile(`msg="serving /healthz" addr=(\S+)`)

// TestKafkaPostgres runs the program against Kafka (kfake, in this process,
// reached over TCP) and PostgreSQL, publishes three payments and a
// duplicate of one, and checks one ledger row per payment, /healthz, and
// that SIGTERM drains and exits 0.
func TestKafkaPostgres(t *testing.T) {
	testKafkaPostgres(t, false)
}

// TestKafkaPostgresWatermark runs it in the watermark mode (WATERMARK=1):
// bob's payment published twice is two offsets, both executed, and the
// ledger's unique message_uuid keeps one row; the watermark table holds one
// row for the topic's partition.
func TestKafkaPostgresWatermark(t *testing.T) {
	testKafkaPostgres(t, true)
}

func testKafkaPostgres(t *testing.T, watermark bool) {
	pool, schema := exampletest.Postgres(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()[0]
	topic := exampletest.Name("payments-")

	log := &exampletest.Log{}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "EXAMPLE_RUN_MAIN=1",
		"KAFKA_BROKERS="+brokers, "KAFKA_TOPIC="+topic, "KAFKA_GROUP="+topic+"-ledger",
		"DATABASE_URL="+exampletest.PostgresDSN, "DB_SCHEMA="+schema, "HTTP_ADDR=127.0.0.1:0")
	if watermark {
		cmd.Env = append(cmd.Env, "WATERMARK=1")
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // if the test failed before SIGTERM
		<-exited
	})
	running := func() error {
		select {
		case <-exited:
			return fmt.Errorf("the program exited: %v", exitErr)
		default:
			return nil
		}
	}

	var addr string
	exampletest.Eventually(t, 60*time.Second, log, "the /healthz address in the log", func() (bool, error) {
		if m := healthzAddr.FindStringSubmatch(log.String()); m != nil {
			addr = m[1]
			return true, nil
		}
		return false, running()
	})
	exampletest.Eventually(t, 60*time.Second, log, "GET /healthz answering 200", func() (bool, error) {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false, running()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, running()
	})

	pc := kafka.DefaultSaramaSyncPublisherConfig()
	pc.Version = sarama.V2_8_0_0
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: []string{brokers}, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pc,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var uuids []string
	var msgs []*message.Message
	for i, account := range []string{"alice", "bob", "carol"} {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"account":%q,"cents":%d}`, account, 100*(i+1)))
		uuids = append(uuids, msg.UUID)
		msgs = append(msgs, msg)
	}
	// bob's payment twice, as a producer that retried would send it.
	if err := pub.Publish(topic, msgs[0], msgs[1], msgs[1], msgs[2]); err != nil {
		t.Fatal(err)
	}

	if watermark {
		exampletest.Eventually(t, 60*time.Second, log, "4 offsets executed", func() (bool, error) {
			return log.Count("outcome=executed") == 4, running()
		})
		var rows, next int64
		if err := pool.QueryRow(t.Context(), "SELECT count(*), max(next_offset) FROM "+pgx.Identifier{schema, "oncemill_records_watermarks"}.Sanitize()).Scan(&rows, &next); err != nil {
			t.Fatal(err)
		}
		if rows != 1 || next != 4 {
			exampletest.Fatalf(t, log, "the watermark table holds %d rows, watermark %d; want 1 row at 4", rows, next)
		}
	} else {
		exampletest.Eventually(t, 60*time.Second, log, "3 payments executed and 1 replayed", func() (bool, error) {
			return log.Count("outcome=executed") == 3 && log.Count("outcome=replayed") == 1, running()
		})
		if n := log.Count("outcome=replayed", "uuid="+uuids[1]); n != 1 {
			exampletest.Fatalf(t, log, "bob's duplicate replayed %d times, want 1", n)
		}
	}
	exampletest.ExactlyOnce(t, exampletest.CountRows(t, pool, pgx.Identifier{schema, "ledger"}.Sanitize()), uuids...)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		exampletest.Fatalf(t, log, "the program did not exit within 60s of SIGTERM")
	}
	if exitErr != nil {
		exampletest.Fatalf(t, log, "after SIGTERM the program exited with %v, want exit status 0", exitErr)
	}
	if log.Count(`msg=drained`) != 1 {
		exampletest.Fatalf(t, log, "the program exited without logging that it drained")
	}
}
