-- The baseline for BenchmarkBeginComplete: one INSERT .. ON CONFLICT DO
-- NOTHING of a fresh (scope, key) per transaction, on a table keyed like
-- oncemill's records. Create the table once, then run at each client count:
--
--   psql -h 127.0.0.1 -U postgres -d test -c "CREATE TABLE IF NOT EXISTS oncemill_pgbench (scope text COLLATE \"C\" NOT NULL, key text COLLATE \"C\" NOT NULL, PRIMARY KEY (scope, key))"
--   pgbench -h 127.0.0.1 -U postgres -n -T 10 -c 1 -j 1 -f store/postgres/testdata/pgbench-insert.sql test
--   pgbench -h 127.0.0.1 -U postgres -n -T 10 -c 4 -j 4 -f store/postgres/testdata/pgbench-insert.sql test
--   pgbench -h 127.0.0.1 -U postgres -n -T 10 -c 16 -j 16 -f store/postgres/testdata/pgbench-insert.sql test
\set k random(1, 9000000000000000)
INSERT INTO oncemill_pgbench (scope, key) VALUES ('bench', 'k-' || :k) ON CONFLICT DO NOTHING;
