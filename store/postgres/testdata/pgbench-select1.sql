-- One round trip and nothing else (docs/benchmarks.md).
SELECT 1;
