-- A plain transaction: BEGIN, one business row, COMMIT (docs/benchmarks.md).
\set k random(1, 1000000000000)
BEGIN;
INSERT INTO pgb.biz VALUES (md5(:k::text || random()::text), 1);
COMMIT;
