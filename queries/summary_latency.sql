-- The latencies of any slice of case_results, each value with its count: the partials
-- of queries/metrics/totals.sql's percentiles (the table `summary_latency`, beside
-- `summary_partial`: queries/summary_partial.sql). Exact: the percentiles are taken over
-- the same values whatever the slices. Narrow on purpose — sixteen bytes a distinct
-- value, and answered latencies are nearly all distinct.
SELECT latency_ms, count(*) AS rows
FROM case_results
WHERE latency_ms IS NOT NULL
GROUP BY latency_ms
