package postgres_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
)

// BenchmarkCPUBurstFloor measures what the machine does to a database
// query's latency while another thread, not the database's, is busy on one
// core: the floor under BenchmarkPartitionedFlatAsItGrows's p99-drop/p99,
// whose passes run statements of a few milliseconds of CPU each. Four
// connections send SELECT 1 at 250 a second each (1,000 in all, as the
// flat benchmark's paced runs claim), and every burstEvery a thread of this
// process, locked to its OS thread and given a Go processor of its own
// (GOMAXPROCS is raised by one, so the queries' goroutines keep theirs),
// does one burst, the kinds taking turns: a sleep of 20 ms (the control:
// the same window, no work), and a busy loop of 2 ms and of 20 ms. For
// each kind it reports the p99 of the queries that overlap a burst over the
// p99 of those that overlap its quiet window, the burst's span a half
// interval later, where nothing runs (the flat benchmark's rule): sleep,
// spin-2ms and spin-20ms -p99/p99, and each p99 in ms.
//
// Where the scheduler runs a waking query on the idle core, a burst on
// the other should cost it nothing, and every ratio be about 1; on the
// 2-core VMs of docs/benchmarks.md it is not ("Flat on a tenth VM, and
// the machine's floor under a pass"). Run it once (about 90 seconds):
//
//	go test -run='^$' -bench=CPUBurstFloor -benchtime=1x ./store/postgres
//
// With -short (scripts/test) it runs 5 seconds: a check that it runs.
func BenchmarkCPUBurstFloor(b *testing.B) {
	length := 90 * time.Second
	if testing.Short() {
		length = 5 * time.Second
	}
	for range b.N {
		burstFloor(b, length)
	}
}

const (
	burstEvery         = 500 * time.Millisecond
	burstClients       = 4
	burstRatePerClient = 250
)

// burstKind is one kind of burst: a busy loop of d, or a sleep of d.
type burstKind struct {
	name string
	d    time.Duration
	spin bool
}

var burstKinds = []burstKind{
	{"sleep", 20 * time.Millisecond, false},
	{"spin-2ms", 2 * time.Millisecond, true},
	{"spin-20ms", 20 * time.Millisecond, true},
}

func burstFloor(b *testing.B, length time.Duration) {
	ctx := b.Context()
	pool := testenv.Pool(b, func(c *pgxpool.Config) { c.MaxConns = burstClients })
	warm(b, pool, burstClients)
	procs := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(procs + 1) // the burst's own
	defer runtime.GOMAXPROCS(procs)

	start := time.Now()
	var mu sync.Mutex
	var queries []span
	var wg sync.WaitGroup
	for c := range burstClients {
		wg.Go(func() {
			var mine []span
			defer func() {
				mu.Lock()
				queries = append(queries, mine...)
				mu.Unlock()
			}()
			every := time.Second / burstRatePerClient
			// The clients' schedules are staggered, as pgbench's are.
			next := start.Add(time.Duration(c) * every / burstClients)
			for time.Since(start) < length {
				time.Sleep(time.Until(next))
				next = next.Add(every)
				from := time.Since(start)
				if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, span{from, time.Since(start)})
			}
		})
	}
	bursts := make([][]span, len(burstKinds))
	wg.Go(func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for i := 0; ; i++ {
			at := start.Add(time.Duration(i+1) * burstEvery)
			if at.Add(burstEvery).Sub(start) > length {
				return
			}
			time.Sleep(time.Until(at))
			k := i % len(burstKinds)
			from := time.Since(start)
			if burstKinds[k].spin {
				for time.Since(start)-from < burstKinds[k].d {
				}
			} else {
				time.Sleep(burstKinds[k].d)
			}
			bursts[k] = append(bursts[k], span{from, time.Since(start)})
		}
	})
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	line := fmt.Sprintf("%d queries over %v", len(queries), length)
	for k, kind := range burstKinds {
		var quiet []span
		for _, s := range bursts[k] {
			quiet = append(quiet, span{s.from + burstEvery/2, s.to + burstEvery/2})
		}
		var inBurst, inQuiet []time.Duration
		for _, q := range queries {
			switch {
			case overlaps(q, bursts[k]):
				inBurst = append(inBurst, q.to-q.from)
			case overlaps(q, quiet):
				inQuiet = append(inQuiet, q.to-q.from)
			}
		}
		if len(inBurst) == 0 || len(inQuiet) == 0 {
			b.Fatalf("%s: %d queries overlapped its %d bursts and %d its quiet windows: nothing to compare", kind.name, len(inBurst), len(bursts[k]), len(inQuiet))
		}
		burst, calm := percentile(inBurst, 0.99), percentile(inQuiet, 0.99)
		b.ReportMetric(burst.Seconds()/calm.Seconds(), kind.name+"-p99/p99")
		b.ReportMetric(msOf(burst), kind.name+"-p99-ms")
		line += fmt.Sprintf("; %s: p99 %v over %d bursts (%d queries, p50 %v), %v in their quiet windows (%d queries, p50 %v): %.2f",
			kind.name, burst, len(bursts[k]), len(inBurst), percentile(inBurst, 0.5), calm, len(inQuiet), percentile(inQuiet, 0.5), burst.Seconds()/calm.Seconds())
	}
	b.Log(line)
}
