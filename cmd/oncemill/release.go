package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/oncemill/oncemill/store"
)

type releaseCmd struct {
	recordID
	Force bool `help:"Release a live in-progress lease or a stored success too (on a file store, a record that cannot be read). The handler may then run twice at once, or again after it succeeded."`
	Yes   bool `short:"y" help:"Do not ask for confirmation."`
}

func (c *releaseCmd) Validate() error { return c.recordID.validate() }

// releaseView is what release prints when it released the key.
type releaseView struct {
	Action  string `json:"action"` // "released"
	Scope   string `json:"scope"`
	Key     string `json:"key"`
	Status  string `json:"status"`
	Token   int64  `json:"token"`
	Attempt int    `json:"attempt"`
	Forced  bool   `json:"forced"`
}

func (c *releaseCmd) Run(a *app) error {
	return a.withStore(func(b *backend) error {
		rec, err := b.admin.Get(a.ctx, c.Scope, c.Key)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return notFound("no live record for %s: nothing to release; its next delivery runs the handler (an expired lease is taken over with the next attempt)", id(c.Scope, c.Key))
		case err != nil && b.deletesUnreadable:
			return c.releaseUnreadable(a, b, err)
		case err != nil:
			return err
		}
		now, err := b.storeNow(a.ctx)
		if err != nil {
			return err
		}
		v := viewOf(rec, now)
		// What is about to go, on stderr so that stdout carries only the result.
		fmt.Fprintf(a.stderr, "%s: %s, attempt %d, token %d, last written %s ago, expires %s\n",
			id(c.Scope, c.Key), v.Status, v.Attempt, v.Token, v.Age, expiryText(v.expiresIn))
		consequence := "its next delivery runs the handler again"
		switch rec.Status {
		case store.StatusInProgress:
			if !c.Force {
				return refused("not released: %s holds a live lease (token %d, expires in %s); a handler may still be running it. "+
					"Wait for the lease to expire, or use --force if its worker is gone or stuck", id(c.Scope, c.Key), rec.Token, v.ExpiresIn)
			}
			consequence = "its next delivery runs the handler again, even if the holder of token " + fmt.Sprint(rec.Token) + " is still running (its outcome will not be recorded)"
		case store.StatusSucceeded:
			if !c.Force {
				return refused("not released: %s succeeded; releasing it makes the next delivery run the handler a second time. "+
					"Use --force if that is what you want", id(c.Scope, c.Key))
			}
			consequence = "its next delivery runs the handler a second time"
		case store.StatusCachedFailure:
			consequence = "the cached failure is forgotten and its next delivery runs the handler again, from attempt 1"
		case store.StatusRetryable:
			consequence = "its attempt count (" + fmt.Sprint(rec.Attempt) + ") is forgotten and its next delivery runs from attempt 1"
		}
		if !c.Yes {
			ok, err := confirm(a, fmt.Sprintf("Release %s (token %d)? Then %s. [y/N] ", id(c.Scope, c.Key), rec.Token, consequence))
			if err != nil {
				return err
			}
			if !ok {
				return refused("not released: not confirmed")
			}
		}
		err = b.admin.Delete(a.ctx, c.Scope, c.Key, rec.Token)
		switch {
		case errors.Is(err, store.ErrLeaseLost):
			return refused("not released: %s changed since it was read (its token is no longer %d: another delivery took it or finished it); inspect it again", id(c.Scope, c.Key), rec.Token)
		case errors.Is(err, store.ErrNotFound):
			return notFound("not released: %s is gone since it was read (expired or deleted); its next delivery runs the handler", id(c.Scope, c.Key))
		case err != nil:
			return err
		}
		out := releaseView{Action: "released", Scope: c.Scope, Key: c.Key, Status: v.Status, Token: rec.Token, Attempt: rec.Attempt, Forced: c.Force}
		if a.g.JSON {
			return writeJSON(a.stdout, out)
		}
		_, err = fmt.Fprintf(a.stdout, "released %s (was %s, attempt %d, token %d): %s\n", id(c.Scope, c.Key), v.Status, rec.Attempt, rec.Token, consequence)
		return err
	})
}

// releaseUnreadable deletes a record that the store cannot read (readErr
// says why), with --force: nothing shows what it held, a live lease or a
// success as well as a failure. Delete under token 0, which no record has,
// removes only a record that cannot be read; a readable one is refused.
func (c *releaseCmd) releaseUnreadable(a *app, b *backend, readErr error) error {
	why := strings.TrimPrefix(readErr.Error(), "oncemill: ")
	if !c.Force {
		return refused("not released: %s cannot be read (%s). Use --force to delete it unread: its next delivery runs the handler, "+
			"from attempt 1, whatever the record held", id(c.Scope, c.Key), why)
	}
	fmt.Fprintf(a.stderr, "%s cannot be read: %s\n", id(c.Scope, c.Key), why)
	const consequence = "its next delivery runs the handler, from attempt 1"
	if !c.Yes {
		ok, err := confirm(a, fmt.Sprintf("Release %s unread? Then %s. [y/N] ", id(c.Scope, c.Key), consequence))
		if err != nil {
			return err
		}
		if !ok {
			return refused("not released: not confirmed")
		}
	}
	err := b.admin.Delete(a.ctx, c.Scope, c.Key, 0)
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		return refused("not released: %s can be read now (it was written meanwhile); inspect it again", id(c.Scope, c.Key))
	case errors.Is(err, store.ErrNotFound):
		return notFound("not released: %s is gone since it was read; its next delivery runs the handler", id(c.Scope, c.Key))
	case err != nil:
		return err
	}
	if a.g.JSON {
		return writeJSON(a.stdout, releaseView{Action: "released", Scope: c.Scope, Key: c.Key, Status: statusUnreadable, Forced: true})
	}
	_, err = fmt.Fprintf(a.stdout, "released %s (was unreadable): %s\n", id(c.Scope, c.Key), consequence)
	return err
}

// statusUnreadable is the status release reports of a record it could not read.
const statusUnreadable = "unreadable"

// confirm asks question on stderr and reads the answer from stdin: yes only
// for "y" or "yes".
func confirm(a *app, question string) (bool, error) {
	fmt.Fprint(a.stderr, question)
	line, err := a.stdin.ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("reading the confirmation: %w", err)
	}
	if errors.Is(err, io.EOF) && line == "" {
		fmt.Fprintln(a.stderr)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}
