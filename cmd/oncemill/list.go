package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/oncemill/oncemill/store"
)

// statusFlag is a --status value: a store.Status by its name.
type statusFlag store.Status

var statusNames = []store.Status{store.StatusInProgress, store.StatusSucceeded, store.StatusCachedFailure, store.StatusRetryable}

func (s *statusFlag) UnmarshalText(b []byte) error {
	for _, st := range statusNames {
		if string(b) == st.String() {
			*s = statusFlag(st)
			return nil
		}
	}
	names := make([]string, len(statusNames))
	for i, st := range statusNames {
		names[i] = st.String()
	}
	return fmt.Errorf("status %q: use one of %s", b, strings.Join(names, ", "))
}

// filters select records for list and purge.
type filters struct {
	Scope     string     `help:"Only this scope."`
	Status    statusFlag `placeholder:"STATUS" help:"Only this status: in_progress, succeeded, cached_failure or retryable."`
	OlderThan age        `placeholder:"DURATION" help:"Only records last written (ClaimLease, heartbeat, Complete, Release) longer ago than this, by the store's clock, e.g. 10m, 24h or 7d."`
}

// request is the store.ListRequest of the filters at the store's time now.
func (f filters) request(now time.Time, limit int) store.ListRequest {
	req := store.ListRequest{Scope: f.Scope, Status: store.Status(f.Status), Limit: limit}
	if f.OlderThan > 0 {
		req.UpdatedBefore = now.Add(-time.Duration(f.OlderThan))
	}
	return req
}

func (f filters) any() bool { return f.Scope != "" || f.Status != 0 || f.OlderThan > 0 }

type listCmd struct {
	filters
	Limit int    `default:"100" help:"Records per page (at most 10000)."`
	After string `placeholder:"CURSOR" help:"Start after this cursor: the one the previous page printed."`
	All   bool   `help:"Print every page, not just one."`
}

const maxPage = 10000

func (c *listCmd) Validate() error {
	if c.Limit < 1 || c.Limit > maxPage {
		return fmt.Errorf("--limit=%d: use 1 to %d", c.Limit, maxPage)
	}
	if c.OlderThan < 0 {
		return fmt.Errorf("--older-than=%v: use a positive duration", c.OlderThan)
	}
	return nil
}

func (c *listCmd) Run(a *app) error {
	return a.withStore(func(b *backend) error {
		now, err := b.storeNow(a.ctx)
		if err != nil {
			return err
		}
		req := c.request(now, c.Limit)
		req.After = c.After
		var t *table
		if !a.g.JSON {
			t = newTable(a.stdout)
			t.row(recordColumns...)
		}
		n := 0
		for page, err := range b.pages(a.ctx, req) {
			if err != nil {
				return err
			}
			for _, r := range page.Records {
				v := viewOf(r, now)
				n++
				if a.g.JSON {
					if err := writeJSON(a.stdout, v); err != nil {
						return err
					}
					continue
				}
				t.row(v.cells()...)
			}
			if page.Next != "" && !c.All {
				if t != nil {
					if err := t.flush(); err != nil {
						return err
					}
				}
				fmt.Fprintf(a.stderr, "%d records; more after this page: add --after=%s (or --all)\n", n, page.Next)
				return nil
			}
		}
		if t != nil {
			if err := t.flush(); err != nil {
				return err
			}
		}
		fmt.Fprintf(a.stderr, "%d records; no more\n", n)
		return nil
	})
}
