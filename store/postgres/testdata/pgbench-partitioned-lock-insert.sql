-- pgbench-partitioned-deferred.sql without the lookup (docs/benchmarks.md).
\set k random(1, 1000000000000)
\startpipeline
BEGIN;
SELECT (CASE WHEN pg_try_advisory_xact_lock(1234, hashtext(md5(:k::text || 'x'))) THEN '1' ELSE 'oncemill: the key is held or has a record' END)::int8;
WITH ins AS (INSERT INTO pgbp.oncemill_records (scope, key, fingerprint, status, token, attempt, taken_over, expires_at, purge_at, created_at, updated_at, message_uuid, claimed_at) SELECT 'bench', md5(:k::text || 'x'), 'abcdef0123456789', 2, 1, 1, false, now() + 86400000000::int8 * interval '1 microsecond', now() + 86400000000::int8 * interval '1 microsecond', now(), now(), '0190e0b8-58f5-7b3c-9d1a-2f4c6e8a0b1c', clock_timestamp() RETURNING token) SELECT coalesce((SELECT token::text FROM ins), 'oncemill: the key is held or has a record')::int8;
INSERT INTO pgbp.biz VALUES (md5(:k::text || random()::text), 1);
\endpipeline
COMMIT;
