package mysql_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/mysql"
)

// The crash test models a broker as a table of messages: a consumer takes
// unacked ones, runs them through the real pipeline in the one-transaction
// mode (idempotency → transaction → handler INSERTing into a ledger), and
// acks a message by marking it after the pipeline returned success. A
// consumer killed before that UPDATE leaves the message unacked, and it is
// delivered again, exactly like a broker's redelivery.
//
// The parent restarts a child consumer process over and over and kills it
// with SIGKILL: the child kills itself at random points between the
// business write and the ack (after the INSERT, before the commit; after
// the commit, before the ack), and the parent kills it at random moments
// too. MariaDB rolls back the transaction of a connection that died. At
// the end every message is acked and the ledger holds exactly one row per
// message.
const (
	crashChildEnv = "ONCEMILL_CRASH_CHILD" // "1" in a child
	crashDSN      = "ONCEMILL_CRASH_DSN"   // the test database
	crashSeed     = "ONCEMILL_CRASH_SEED"  // the child's random seed
	crashKill     = "ONCEMILL_CRASH_KILL"  // "1": the child kills itself at random points

	crashMessages = 400
	crashKills    = 40
)

func TestCrashRecovery(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		return // a child runs TestCrashChild only
	}
	t.Parallel()
	dsn := testenv.MariaDBDatabase(t)
	db := testenv.MariaDB(t, dsn)
	newStore(t, db, mysql.Options{})
	ctx := t.Context()
	values := make([]string, crashMessages)
	for i := range values {
		values[i] = fmt.Sprintf("(%d, 'msg-%d')", i+1, i+1)
	}
	for _, q := range []string{
		"CREATE TABLE messages (id INT PRIMARY KEY, uuid VARCHAR(64) NOT NULL, acked BOOLEAN NOT NULL DEFAULT FALSE, deliveries INT NOT NULL DEFAULT 0)",
		"CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, message_uuid VARCHAR(64) NOT NULL, amount INT NOT NULL)", // no unique key: a double effect would show
		"INSERT INTO messages (id, uuid) VALUES " + strings.Join(values, ", "),
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	deadline := time.Now().Add(4 * time.Minute) // hang guard
	kills, selfKills, parentKills, runs := 0, 0, 0, 0
	for kills < crashKills {
		if time.Now().After(deadline) {
			t.Fatalf("only %d kills in the time bound", kills)
		}
		runs++
		// Half the runs kill themselves at the chosen points; the other half
		// are killed from outside at a random moment.
		selfKill := rand.IntN(2) == 0
		cmd := crashChild(dsn, runs, selfKill)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var timer *time.Timer
		var parentFired sync.Mutex
		fired := false
		if !selfKill {
			timer = time.AfterFunc(time.Duration(20+rand.IntN(230))*time.Millisecond, func() {
				parentFired.Lock()
				fired = true
				parentFired.Unlock()
				cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck // it may have exited
			})
		}
		err := cmd.Wait()
		if timer != nil {
			timer.Stop()
		}
		var exit *exec.ExitError
		switch {
		case err == nil:
			// Finished every message before any kill; the budget is not spent.
			if unacked(t, db) == 0 {
				// Put a third back in the broker to keep crashing.
				if _, err := db.ExecContext(ctx, "UPDATE messages SET acked = FALSE WHERE id % 3 = 0"); err != nil {
					t.Fatal(err)
				}
			}
		case errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signaled():
			kills++
			parentFired.Lock()
			if fired {
				parentKills++
			} else {
				selfKills++
			}
			parentFired.Unlock()
		default:
			t.Fatalf("child run %d failed: %v\n%s", runs, err, out.String())
		}
	}

	// A last consumer without kills drains the broker.
	if out, err := crashChild(dsn, runs+1, false).CombinedOutput(); err != nil {
		t.Fatalf("final child failed: %v\n%s", err, out)
	}
	if left := unacked(t, db); left != 0 {
		t.Fatalf("%d messages never acked", left)
	}
	var wrong, distinct, total, redeliveries, retried, notSucceeded int
	for q, dest := range map[string][]any{
		"SELECT COUNT(*) FROM (SELECT message_uuid FROM ledger GROUP BY message_uuid HAVING COUNT(*) <> 1) x": {&wrong},
		"SELECT COUNT(DISTINCT message_uuid), COUNT(*) FROM ledger":                                           {&distinct, &total},
		"SELECT COALESCE(SUM(deliveries - 1), 0) FROM messages":                                               {&redeliveries},
		"SELECT COUNT(*) FROM oncemill_records WHERE attempt > 1":                                             {&retried},
		"SELECT COUNT(*) FROM oncemill_records WHERE scope = 'crash' AND status <> 2":                         {&notSucceeded},
	} {
		if err := db.QueryRowContext(ctx, q).Scan(dest...); err != nil {
			t.Fatal(err)
		}
	}
	if wrong != 0 || distinct != crashMessages || total != crashMessages {
		t.Fatalf("ledger: %d messages with more or fewer than one row; %d distinct messages in %d rows; want exactly one row for each of %d",
			wrong, distinct, total, crashMessages)
	}
	if notSucceeded != 0 {
		t.Fatalf("%d records are not succeeded", notSucceeded)
	}
	t.Logf("%d child runs, %d SIGKILLs (%d self-inflicted between write and ack, %d from the parent at random moments); %d redeliveries; %d keys executed more than once — ledger: exactly one row for each of %d messages",
		runs, kills, selfKills, parentKills, redeliveries, retried, crashMessages)
}

func crashChild(dsn string, seed int, kill bool) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1", "-test.timeout=3m")
	k := "0"
	if kill {
		k = "1"
	}
	cmd.Env = append(os.Environ(), crashChildEnv+"=1", crashDSN+"="+dsn, crashSeed+"="+strconv.Itoa(seed), crashKill+"="+k)
	return cmd
}

func unacked(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM messages WHERE NOT acked").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCrashChild is the consumer process of TestCrashRecovery. Run alone it
// does nothing.
func TestCrashChild(t *testing.T) {
	if os.Getenv(crashChildEnv) != "1" {
		t.Log("helper process of TestCrashRecovery; nothing to do when run alone")
		return
	}
	seed, _ := strconv.Atoi(os.Getenv(crashSeed))
	kill := os.Getenv(crashKill) == "1"
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(time.Now().UnixNano())))
	var rngMu sync.Mutex
	maybeDie := func(p float64) {
		if !kill {
			return
		}
		rngMu.Lock()
		die := rng.Float64() < p
		rngMu.Unlock()
		if die {
			syscall.Kill(os.Getpid(), syscall.SIGKILL) //nolint:errcheck
			select {}                                  // never reached
		}
	}

	db := testenv.MariaDB(t, os.Getenv(crashDSN))
	s, err := mysql.New(db, mysql.Options{CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := policy.Policy{
		HeldKey:     policy.HeldKeyNack, // the broker redelivers later
		NackDelay:   10 * time.Millisecond,
		MaxAttempts: 1 << 20, // crashes are not failures to cap
	}
	idem, err := receiver.NewTransactional(s).WithScope("crash").WithPolicy(p).Build()
	if err != nil {
		t.Fatal(err)
	}
	h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := mysql.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no transaction")
		}
		if _, err := tx.ExecContext(msg.Context(), "INSERT INTO ledger (message_uuid, amount) VALUES (?, 100)", msg.UUID); err != nil {
			return nil, err
		}
		maybeDie(0.05) // after the business write, before the commit
		return nil, nil
	})

	ctx := context.Background()
	for {
		rows, err := db.QueryContext(ctx, "SELECT id, uuid FROM messages WHERE NOT acked ORDER BY RAND() LIMIT 8")
		if err != nil {
			t.Fatal(err)
		}
		type delivery struct {
			id   int
			uuid string
		}
		var batch []delivery
		for rows.Next() {
			var d delivery
			if err := rows.Scan(&d.id, &d.uuid); err != nil {
				t.Fatal(err)
			}
			batch = append(batch, d)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if len(batch) == 0 {
			return // every message acked
		}
		var wg sync.WaitGroup
		for _, d := range batch {
			wg.Go(func() {
				if _, err := db.ExecContext(ctx, "UPDATE messages SET deliveries = deliveries + 1 WHERE id = ?", d.id); err != nil {
					t.Error(err)
					return
				}
				if _, err := h(message.NewMessage(d.uuid, []byte("pay 100"))); err != nil {
					return // nack: delivered again later
				}
				maybeDie(0.05) // after the commit, before the ack
				if _, err := db.ExecContext(ctx, "UPDATE messages SET acked = TRUE WHERE id = ?", d.id); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
	}
}
