package mysql_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	driver "github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/oncemill/oncemill/internal/testenv"
)

// proxied starts a toxiproxy proxy in process in front of the test
// database dsn (MariaDBDatabase) and returns it with a pool of at most
// conns connections through it. The driver's dial is bounded, so that a
// connection attempt through a cut proxy fails rather than hangs.
func proxied(t *testing.T, dsn string, conns int) (*toxiproxy.Proxy, *sql.DB) {
	t.Helper()
	cfg, err := driver.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "mariadb", "127.0.0.1:0", cfg.Addr)
	if err := p.Start(); err != nil {
		t.Fatalf("starting the proxy: %v", err)
	}
	t.Cleanup(p.Stop)
	cfg.Addr, cfg.Timeout = p.Listen, 500*time.Millisecond
	db := testenv.MariaDB(t, cfg.FormatDSN())
	db.SetMaxOpenConns(conns)
	return p, db
}

// stall makes the proxy hold back everything the server sends, without
// closing any connection: a server or network that stops answering.
func stall(t *testing.T, p *toxiproxy.Proxy) {
	t.Helper()
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(`{"name":"stall","type":"timeout","stream":"downstream","toxicity":1,"attributes":{"timeout":0}}`)); err != nil {
		t.Fatal(err)
	}
}
