-- The hand-written inbox in two round trips: BEGIN sent with the inbox row
-- and the business row, COMMIT (docs/benchmarks.md).
\set k random(1, 1000000000000)
\startpipeline
BEGIN;
INSERT INTO pgb.inbox VALUES (md5(:k::text || 'x'), now()) ON CONFLICT DO NOTHING;
INSERT INTO pgb.biz VALUES (md5(:k::text || random()::text), 1);
\endpipeline
COMMIT;
