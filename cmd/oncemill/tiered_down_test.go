package main

import (
	"net"
	"strings"
	"testing"

	"github.com/oncemill/oncemill/store"
)

// With --store=tiered and Redis down, the commands that read go on from
// PostgreSQL, the truth, with a warning that names Redis; a release fails,
// since it could not reach the workers' caches, and changes nothing.
func TestTieredReadsTheTruthWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	fx := newTieredFixture(t)
	seed(t, fx.st, scope)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close() // nothing listens there now: a refused connection, as a Redis that is down
	flags := []string{"--redis-addr=" + down}
	for _, args := range [][]string{{"inspect", "--scope", scope, "--key", keyFailed}, {"list", "--scope", scope}, {"stats", "--scope", scope}} {
		r := fx.cli(t, nil, append(flags, args...)...).mustCode(t, exitOK)
		if !strings.Contains(r.stderr, "Redis at "+down+" is unreachable") || !strings.Contains(r.stderr, "reading PostgreSQL") {
			t.Errorf("%s with Redis down: stderr %q; want a warning naming Redis", args[0], r.stderr)
		}
		if r.stdout == "" {
			t.Errorf("%s with Redis down printed nothing", args[0])
		}
	}
	if r := fx.cli(t, nil, append(flags, "release", "--yes", "--scope", scope, "--key", keyFailed)...); r.code == exitOK {
		t.Errorf("release with Redis down: exit 0, stdout %q; want a failure", r.stdout)
	}
	if rec, err := fx.st.Get(t.Context(), scope, keyFailed); err != nil || rec.Status != store.StatusCachedFailure {
		t.Fatalf("after the failed release: %+v, %v; want the cached failure kept", rec, err)
	}
}
