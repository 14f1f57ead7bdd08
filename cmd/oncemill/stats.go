package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

type statsCmd struct {
	Scope    string `help:"Only this scope."`
	PageSize int    `default:"1000" help:"Records read per List call (at most 10000). On Redis every page scans the whole prefix: raise it for large stores."`
}

func (c *statsCmd) Validate() error {
	if c.PageSize < 1 || c.PageSize > maxPage {
		return fmt.Errorf("--page-size=%d: use 1 to %d", c.PageSize, maxPage)
	}
	return nil
}

// statsView is what stats prints.
type statsView struct {
	Store   string    `json:"store"`
	Now     time.Time `json:"now"`
	Records int       `json:"records"`
	Live    int       `json:"live"`
	// Expired counts the expired records still stored: the expired backlog.
	Expired int          `json:"expired"`
	Counts  []countEntry `json:"counts"`
	// OldestInProgress is the live lease whose record was created first.
	OldestInProgress *leaseEntry `json:"oldest_in_progress,omitempty"`
	// OldestExpired is the expired record that expired first; CleanupLag is
	// how long ago ("0s" when there is none).
	OldestExpired *expiredEntry `json:"oldest_expired,omitempty"`
	CleanupLag    string        `json:"cleanup_lag"`
	// StoreCleanupLag is the store's own measure, for stores that keep one
	// (PostgreSQL: oncemill.store.cleanup.lag, from each record's purge time).
	StoreCleanupLag string `json:"store_cleanup_lag,omitempty"`
	// Partitions are the table's partitions, oldest first, for a
	// PostgreSQL table of the partitioned layout.
	Partitions []partitionEntry `json:"partitions,omitempty"`
}

type partitionEntry struct {
	Name string `json:"name"`
	// From is empty for the partition a converted table became (MINVALUE).
	From string `json:"from,omitempty"`
	To   string `json:"to"`
	Rows int64  `json:"rows"`
}

// partitionLister is implemented by stores whose table may be partitioned
// (PostgreSQL).
type partitionLister interface {
	Partitions(ctx context.Context) ([]postgres.Partition, error)
}

type countEntry struct {
	Scope   string `json:"scope"`
	Status  string `json:"status"`
	Live    int    `json:"live"`
	Expired int    `json:"expired"`
}

type leaseEntry struct {
	Scope   string `json:"scope"`
	Key     string `json:"key"`
	Token   int64  `json:"token"`
	Attempt int    `json:"attempt"`
	// InProgressFor is the time since the record was created: how long the
	// key has been in progress, takeovers included.
	InProgressFor string `json:"in_progress_for"`
	// LastWritten is the time since the last ClaimLease or heartbeat.
	LastWritten string `json:"last_written"`
	ExpiresIn   string `json:"expires_in"`
}

type expiredEntry struct {
	Scope      string `json:"scope"`
	Key        string `json:"key"`
	Status     string `json:"status"`
	ExpiredFor string `json:"expired_for"`
}

func (c *statsCmd) Run(a *app) error {
	return a.withStore(func(b *backend) error {
		now, err := b.storeNow(a.ctx)
		if err != nil {
			return err
		}
		v := statsView{Store: b.where, Now: now, CleanupLag: fmtDuration(0)}
		type group struct {
			scope  string
			status store.Status
		}
		counts := map[group]*countEntry{}
		var oldestLease, oldestExpired *store.Record
		req := store.ListRequest{Scope: c.Scope, Limit: c.PageSize}
		for page, err := range b.pages(a.ctx, req) {
			if err != nil {
				return err
			}
			for i := range page.Records {
				r := &page.Records[i]
				g := group{r.Scope, r.Status}
				e := counts[g]
				if e == nil {
					e = &countEntry{Scope: r.Scope, Status: r.Status.String()}
					counts[g] = e
				}
				v.Records++
				if r.ExpiresAt.After(now) {
					v.Live++
					e.Live++
					if r.Status == store.StatusInProgress && (oldestLease == nil || r.CreatedAt.Before(oldestLease.CreatedAt)) {
						oldestLease = r
					}
					continue
				}
				v.Expired++
				e.Expired++
				if oldestExpired == nil || r.ExpiresAt.Before(oldestExpired.ExpiresAt) {
					oldestExpired = r
				}
			}
		}
		for _, e := range counts {
			v.Counts = append(v.Counts, *e)
		}
		slices.SortFunc(v.Counts, func(x, y countEntry) int {
			return cmp.Or(cmp.Compare(x.Scope, y.Scope), cmp.Compare(statusOrder(x.Status), statusOrder(y.Status)))
		})
		if r := oldestLease; r != nil {
			v.OldestInProgress = &leaseEntry{Scope: r.Scope, Key: r.Key, Token: r.Token, Attempt: r.Attempt,
				InProgressFor: fmtDuration(now.Sub(r.CreatedAt)), LastWritten: fmtDuration(now.Sub(r.UpdatedAt)),
				ExpiresIn: fmtDuration(r.ExpiresAt.Sub(now))}
		}
		if r := oldestExpired; r != nil {
			lag := fmtDuration(now.Sub(r.ExpiresAt))
			v.OldestExpired = &expiredEntry{Scope: r.Scope, Key: r.Key, Status: r.Status.String(), ExpiredFor: lag}
			v.CleanupLag = lag
		}
		if l, ok := b.admin.(cleanupLagger); ok {
			lag, err := l.CleanupLag(a.ctx)
			if err != nil {
				return err
			}
			v.StoreCleanupLag = fmtDuration(lag)
		}
		if l, ok := b.admin.(partitionLister); ok {
			parts, err := l.Partitions(a.ctx)
			if err != nil {
				return err
			}
			for _, p := range parts {
				e := partitionEntry{Name: p.Name, To: stamp(p.To), Rows: p.Rows}
				if !p.From.IsZero() {
					e.From = stamp(p.From)
				}
				v.Partitions = append(v.Partitions, e)
			}
		}
		if a.g.JSON {
			return writeJSONIndented(a.stdout, v)
		}
		return printStats(a, v)
	})
}

func statusOrder(name string) int {
	for i, s := range statusNames {
		if s.String() == name {
			return i
		}
	}
	return len(statusNames)
}

func printStats(a *app, v statsView) error {
	fmt.Fprintf(a.stdout, "%s, %s\n\n", v.Store, stamp(v.Now))
	t := newTable(a.stdout)
	t.row("SCOPE", "STATUS", "LIVE", "EXPIRED")
	for _, e := range v.Counts {
		t.row(shown(e.Scope), e.Status, e.Live, e.Expired)
	}
	t.row("total", "", v.Live, v.Expired)
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout)
	t = newTable(a.stdout)
	t.row("records", fmt.Sprintf("%d (%d live, %d expired and not yet removed)", v.Records, v.Live, v.Expired))
	if l := v.OldestInProgress; l != nil {
		t.row("oldest in-progress lease", fmt.Sprintf("%s: in progress for %s (attempt %d, token %d), last written %s ago, lease expires in %s",
			id(l.Scope, l.Key), l.InProgressFor, l.Attempt, l.Token, l.LastWritten, l.ExpiresIn))
	} else {
		t.row("oldest in-progress lease", "none")
	}
	if e := v.OldestExpired; e != nil {
		t.row("cleanup lag", fmt.Sprintf("%s (oldest expired record: %s, %s)", v.CleanupLag, id(e.Scope, e.Key), e.Status))
	} else {
		t.row("cleanup lag", v.CleanupLag+" (no expired record stored)")
	}
	if v.StoreCleanupLag != "" {
		t.row("store's cleanup lag", v.StoreCleanupLag+" (records past their purge time; the oncemill.store.cleanup.lag gauge)")
	}
	if err := t.flush(); err != nil || len(v.Partitions) == 0 {
		return err
	}
	fmt.Fprintln(a.stdout)
	t = newTable(a.stdout)
	t.row("PARTITION", "FROM", "TO", "ROWS")
	for _, p := range v.Partitions {
		t.row(p.Name, cmp.Or(p.From, "MINVALUE"), p.To, p.Rows)
	}
	return t.flush()
}
