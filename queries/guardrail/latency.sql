-- A guardrail's latency per call (ms): exact percentiles (linear interpolation) over
-- every call that took time, errors included (a timeout is a slow call too).
SELECT run_id,
       count(latency_ms)                                       AS calls,
       percentile_cont(0.5)  WITHIN GROUP (ORDER BY latency_ms) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) AS p95,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms) AS p99,
       max(latency_ms)                                         AS max,
       avg(latency_ms)                                         AS mean
FROM guard_results
WHERE latency_ms IS NOT NULL
GROUP BY run_id
ORDER BY run_id
