package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/oncemill/oncemill/store"
)

type purgeCmd struct {
	filters
	Batch  int  `default:"1000" help:"Records per batch: one List page, then its deletes (at most 10000)."`
	DryRun bool `default:"true" help:"Only print what would be deleted (default true): --dry-run=false deletes."`
	Force  bool `help:"Delete live in-progress leases too (they are skipped otherwise): their handlers may then run twice at once."`
}

// Purge actions, one per matched record.
const (
	actionWouldDelete = "would_delete"
	actionDeleted     = "deleted"
	actionSkippedLive = "skipped_live_lease" // a live lease, without --force
	actionChanged     = "skipped_changed"    // its token changed since the page was read
	actionGone        = "skipped_gone"       // it went away since the page was read
)

// purgeLine is one matched record and what purge did with it.
type purgeLine struct {
	Action string `json:"action"`
	recordView
}

// purgeSummary is purge's last line.
type purgeSummary struct {
	Action      string `json:"action"` // "summary"
	DryRun      bool   `json:"dry_run"`
	Matched     int    `json:"matched"`
	WouldDelete int    `json:"would_delete"`
	Deleted     int    `json:"deleted"`
	SkippedLive int    `json:"skipped_live_lease"`
	Changed     int    `json:"skipped_changed"`
	Gone        int    `json:"skipped_gone"`
	Batches     int    `json:"batches"`
}

func (c *purgeCmd) Validate() error {
	if c.Batch < 1 || c.Batch > maxPage {
		return fmt.Errorf("--batch=%d: use 1 to %d", c.Batch, maxPage)
	}
	if c.OlderThan < 0 {
		return fmt.Errorf("--older-than=%v: use a positive duration", c.OlderThan)
	}
	if !c.any() {
		return errors.New("needs --scope, --status or --older-than: purge does not delete every record at once")
	}
	return nil
}

func (c *purgeCmd) Run(a *app) error {
	return a.withStore(func(b *backend) error {
		now, err := b.storeNow(a.ctx)
		if err != nil {
			return err
		}
		sum := purgeSummary{Action: "summary", DryRun: c.DryRun}
		var t *table
		if !a.g.JSON {
			t = newTable(a.stdout)
			t.row(append([]any{"ACTION"}, recordColumns...)...)
		}
		req := c.request(now, c.Batch)
		for page, err := range b.pages(a.ctx, req) {
			if err != nil {
				return err
			}
			if len(page.Records) > 0 {
				sum.Batches++
			}
			for _, r := range page.Records {
				sum.Matched++
				action, err := c.purgeOne(a, b, r, now)
				if err != nil {
					if t != nil {
						_ = t.flush()
					}
					return fmt.Errorf("after %d deleted: %w", sum.Deleted, err)
				}
				switch action {
				case actionWouldDelete:
					sum.WouldDelete++
				case actionDeleted:
					sum.Deleted++
				case actionSkippedLive:
					sum.SkippedLive++
				case actionChanged:
					sum.Changed++
				case actionGone:
					sum.Gone++
				}
				line := purgeLine{Action: action, recordView: viewOf(r, now)}
				if a.g.JSON {
					if err := writeJSON(a.stdout, line); err != nil {
						return err
					}
				} else {
					t.row(append([]any{action}, line.cells()...)...)
				}
			}
		}
		if a.g.JSON {
			return writeJSON(a.stdout, sum)
		}
		if err := t.flush(); err != nil {
			return err
		}
		skipped := fmt.Sprintf("skipped: %d live leases, %d changed meanwhile, %d gone meanwhile", sum.SkippedLive, sum.Changed, sum.Gone)
		if c.DryRun {
			_, err = fmt.Fprintf(a.stdout, "\ndry run: %d of %d matching records would be deleted (%s); nothing was deleted. Run again with --dry-run=false to delete them.\n",
				sum.WouldDelete, sum.Matched, skipped)
		} else {
			_, err = fmt.Fprintf(a.stdout, "\ndeleted %d of %d matching records in %d batches (%s).\n", sum.Deleted, sum.Matched, sum.Batches, skipped)
		}
		return err
	})
}

// purgeOne deletes r, fenced by the token it was listed with, unless it is
// a live lease without --force or this is a dry run.
func (c *purgeCmd) purgeOne(a *app, b *backend, r store.Record, now time.Time) (string, error) {
	if r.Status == store.StatusInProgress && r.ExpiresAt.After(now) && !c.Force {
		return actionSkippedLive, nil
	}
	if c.DryRun {
		return actionWouldDelete, nil
	}
	err := b.admin.Delete(a.ctx, r.Scope, r.Key, r.Token)
	switch {
	case err == nil:
		return actionDeleted, nil
	case errors.Is(err, store.ErrLeaseLost):
		return actionChanged, nil
	case errors.Is(err, store.ErrNotFound):
		return actionGone, nil
	}
	return "", err
}
