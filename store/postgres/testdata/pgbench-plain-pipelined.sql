-- A plain transaction in two round trips: BEGIN sent with the business
-- row, COMMIT (docs/benchmarks.md).
\set k random(1, 1000000000000)
\startpipeline
BEGIN;
INSERT INTO pgb.biz VALUES (md5(:k::text || random()::text), 1);
\endpipeline
COMMIT;
