-- The hand-written inbox: BEGIN sent with the inbox insert, the business
-- row, COMMIT (docs/benchmarks.md).
\set k random(1, 1000000000000)
\startpipeline
BEGIN;
INSERT INTO pgb.oncemill_records (scope, key, fingerprint, status, token, attempt, created_at, updated_at, expires_at, purge_at) VALUES ('bench', md5(:k::text || 'x'), '', 2, 1, 1, now(), now(), now() + interval '1 day', now() + interval '1 day') ON CONFLICT DO NOTHING;
\endpipeline
INSERT INTO pgb.biz VALUES (md5(:k::text || random()::text), 1);
COMMIT;
