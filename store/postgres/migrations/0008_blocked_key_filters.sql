-- The key filters of the partitioned layout are blocked Bloom filters
-- (github.com/greatroar/blobloom), which test a key in one cache line,
-- where the filters before spread its bits over the whole filter
-- (docs/benchmarks.md, "Key filters in one cache line"). The table of the
-- filters in the earlier encoding goes; Migrate creates it again, empty,
-- and the cleaner's leader builds every closed partition's filter anew at
-- its next pass. Until then, claims look a key up in every partition, as
-- they do before a worker's first pass. The DELETE layout has no such
-- table.
DROP TABLE IF EXISTS {{KEY_FILTERS}};
