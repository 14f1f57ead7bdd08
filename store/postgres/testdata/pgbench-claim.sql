-- oncemill's claim (the fast path of sqlClaimNew, with literals) sent with
-- BEGIN, the business row, COMMIT (docs/benchmarks.md).
\set k random(1, 1000000000000)
\startpipeline
BEGIN;
INSERT INTO pgb.oncemill_records (scope, key, fingerprint, status, token, attempt, taken_over, expires_at, purge_at, created_at, updated_at) SELECT 'bench', md5(:k::text || 'x'), 'abcdef0123456789', 2, nextval('pgb.oncemill_records_token_seq'), 1, false, now() + 86400000000::int8 * interval '1 microsecond', now() + 86400000000::int8 * interval '1 microsecond', now(), now() WHERE pg_try_advisory_xact_lock(1234, hashtext(md5(:k::text || 'x'))) ON CONFLICT (scope, key) DO NOTHING RETURNING token;
\endpipeline
INSERT INTO pgb.biz VALUES (md5(:k::text || random()::text), 1);
COMMIT;
