package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
)

// The crash test models a broker as a table of messages: a consumer takes
// unacked ones, runs them through the real pipeline in the one-transaction mode
// (idempotency → transaction → handler INSERTing into a ledger), and acks a
// message by marking it after the pipeline returned success. A consumer
// killed before that UPDATE leaves the message unacked, and it is delivered
// again, exactly like a broker's redelivery.
//
// The parent restarts a child consumer process over and over and kills it
// with SIGKILL: the child kills itself at random points between the
// business write and the ack (after the INSERT, before the commit; after the
// commit, before the ack), and the parent kills it at random moments too.
// At the end every message is acked and the ledger holds exactly one row per
// message.
const (
	crashChildEnv = "ONCEMILL_CRASH_CHILD"    // "1" in a child
	crashSchema   = "ONCEMILL_CRASH_SCHEMA"   // the schema to work in
	crashSeed     = "ONCEMILL_CRASH_SEED"     // the child's random seed
	crashKill     = "ONCEMILL_CRASH_KILL"     // "1": the child kills itself at random points
	crashLayout   = "ONCEMILL_CRASH_LAYOUT"   // postgres.Layout, as a number
	crashDeferred = "ONCEMILL_CRASH_DEFERRED" // "true": the claim is deferred (receiver.Builder.WithDeferredClaim)

	crashMessages = 400
	crashKills    = 40
)

func TestCrashRecovery(t *testing.T) {
	t.Parallel()
	testCrashRecovery(t, postgres.LayoutDelete, false)
}

// The same on the partitioned layout.
func TestCrashRecoveryPartitioned(t *testing.T) {
	t.Parallel()
	testCrashRecovery(t, postgres.LayoutPartitioned, false)
}

// The same on both layouts with the claim sent with the handler's first
// statement (the deferred claim).
func TestCrashRecoveryDeferred(t *testing.T) {
	t.Parallel()
	for name, layout := range map[string]postgres.Layout{"delete": postgres.LayoutDelete, "partitioned": postgres.LayoutPartitioned} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testCrashRecovery(t, layout, true)
		})
	}
}

func testCrashRecovery(t *testing.T, layout postgres.Layout, deferred bool) {
	if os.Getenv(crashChildEnv) != "" {
		return // a child runs TestCrashChild only
	}
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	newStore(t, pool, postgres.Options{Schema: schema, Layout: layout})
	ctx := t.Context()
	messages := pgx.Identifier{schema, "messages"}.Sanitize()
	ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
	for _, q := range []string{
		"CREATE TABLE " + messages + " (id int PRIMARY KEY, uuid text NOT NULL, acked boolean NOT NULL DEFAULT false, deliveries int NOT NULL DEFAULT 0)",
		"CREATE TABLE " + ledger + " (id bigserial PRIMARY KEY, message_uuid text NOT NULL, amount int NOT NULL)", // no unique key: a double effect would show
		fmt.Sprintf("INSERT INTO %s (id, uuid) SELECT i, 'msg-' || i FROM generate_series(1, %d) i", messages, crashMessages),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
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
		cmd := crashChild(schema, layout, deferred, runs, selfKill)
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
			if left := unacked(t, pool, messages); left == 0 {
				// Put everything back in the broker to keep crashing.
				if _, err := pool.Exec(ctx, "UPDATE "+messages+" SET acked = false WHERE id % 3 = 0"); err != nil {
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
	cmd := crashChild(schema, layout, deferred, runs+1, false)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("final child failed: %v\n%s", err, out)
	}

	if left := unacked(t, pool, messages); left != 0 {
		t.Fatalf("%d messages never acked", left)
	}
	var wrong, distinct, total, redeliveries, takeovers int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM (SELECT message_uuid FROM "+ledger+" GROUP BY message_uuid HAVING count(*) <> 1) x").Scan(&wrong); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(DISTINCT message_uuid), count(*) FROM "+ledger).Scan(&distinct, &total); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 || distinct != crashMessages || total != crashMessages {
		t.Fatalf("ledger: %d messages with more or fewer than one row; %d distinct messages in %d rows; want exactly one row for each of %d",
			wrong, distinct, total, crashMessages)
	}
	if err := pool.QueryRow(ctx, "SELECT coalesce(sum(deliveries - 1), 0) FROM "+messages).Scan(&redeliveries); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table(schema, "")+" WHERE attempt > 1").Scan(&takeovers); err != nil {
		t.Fatal(err)
	}
	var notSucceeded int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table(schema, "")+" WHERE scope = 'crash' AND status <> 2").Scan(&notSucceeded); err != nil {
		t.Fatal(err)
	}
	if notSucceeded != 0 {
		t.Fatalf("%d records are not succeeded", notSucceeded)
	}
	t.Logf("%d child runs, %d SIGKILLs (%d self-inflicted between write and ack, %d from the parent at random moments); %d redeliveries; %d keys executed more than once (rolled back by the crash) — ledger: exactly one row for each of %d messages",
		runs, kills, selfKills, parentKills, redeliveries, takeovers, crashMessages)
}

func crashChild(schema string, layout postgres.Layout, deferred bool, seed int, kill bool) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1", "-test.timeout=3m")
	k := "0"
	if kill {
		k = "1"
	}
	cmd.Env = append(os.Environ(),
		crashChildEnv+"=1",
		crashSchema+"="+schema,
		crashSeed+"="+strconv.Itoa(seed),
		crashKill+"="+k,
		crashLayout+"="+strconv.Itoa(int(layout)),
		crashDeferred+"="+strconv.FormatBool(deferred),
		"ONCEMILL_POSTGRES_DSN="+testenv.PostgresDSN(),
	)
	return cmd
}

func unacked(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, messages string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+messages+" WHERE NOT acked").Scan(&n); err != nil {
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
	schema := os.Getenv(crashSchema)
	seed, _ := strconv.Atoi(os.Getenv(crashSeed))
	kill := os.Getenv(crashKill) == "1"
	layout, _ := strconv.Atoi(os.Getenv(crashLayout))
	deferred, _ := strconv.ParseBool(os.Getenv(crashDeferred))
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

	pool := testenv.Pool(t)
	s, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1, Layout: postgres.Layout(layout)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	messages := pgx.Identifier{schema, "messages"}.Sanitize()
	ledger := pgx.Identifier{schema, "ledger"}.Sanitize()

	p := policy.Policy{
		HeldKey:     policy.HeldKeyNack, // the broker redelivers later
		NackDelay:   10 * time.Millisecond,
		MaxAttempts: 1 << 20, // crashes are not failures to cap
	}
	idem, err := receiver.NewTransactional(s).WithScope("crash").WithPolicy(p).WithDeferredClaim(deferred).Build()
	if err != nil {
		t.Fatal(err)
	}
	h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := postgres.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no transaction")
		}
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+ledger+" (message_uuid, amount) VALUES ($1, 100)", msg.UUID); err != nil {
			return nil, err
		}
		maybeDie(0.05) // after the business write, before the commit
		return nil, nil
	})

	ctx := context.Background()
	for {
		rows, err := pool.Query(ctx, "SELECT id, uuid FROM "+messages+" WHERE NOT acked ORDER BY random() LIMIT 8")
		if err != nil {
			t.Fatal(err)
		}
		type delivery struct {
			id   int
			uuid string
		}
		batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (delivery, error) {
			var d delivery
			return d, r.Scan(&d.id, &d.uuid)
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(batch) == 0 {
			return // every message acked
		}
		var wg sync.WaitGroup
		for _, d := range batch {
			wg.Go(func() {
				if _, err := pool.Exec(ctx, "UPDATE "+messages+" SET deliveries = deliveries + 1 WHERE id = $1", d.id); err != nil {
					t.Error(err)
					return
				}
				if _, err := h(message.NewMessage(d.uuid, []byte("pay 100"))); err != nil {
					return // nack: delivered again later
				}
				maybeDie(0.05) // after the commit, before the ack
				if _, err := pool.Exec(ctx, "UPDATE "+messages+" SET acked = true WHERE id = $1", d.id); err != nil {
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
