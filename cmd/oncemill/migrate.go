package main

import "fmt"

type migrateCmd struct{}

func (c *migrateCmd) Run(a *app) error {
	return a.withBackend(func(b *backend) error {
		m, err := b.migrate(a.ctx)
		if err != nil {
			return err
		}
		if a.g.JSON {
			return writeJSON(a.stdout, m)
		}
		switch {
		case m.Note != "":
			_, err = fmt.Fprintf(a.stdout, "%s %s: nothing to migrate: %s\n", m.Store, m.Target, m.Note)
		case m.FromLayout != "" && m.FromLayout != m.ToLayout:
			_, err = fmt.Fprintf(a.stdout, "converted %s %s from the %s layout to the %s layout, at schema version %d\n", m.Store, m.Target, m.FromLayout, m.ToLayout, m.To)
		case m.Changed:
			_, err = fmt.Fprintf(a.stdout, "migrated %s %s from schema version %d to %d\n", m.Store, m.Target, m.From, m.To)
		default:
			_, err = fmt.Fprintf(a.stdout, "%s %s is at schema version %d already: nothing changed\n", m.Store, m.Target, m.To)
		}
		return err
	})
}
