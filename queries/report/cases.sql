-- The report's case table: every case with its decisions (capped by the report; the full
-- table is case_results.parquet).
SELECT case_id, attack_family, attack_surface, severity, label,
       attack_success, prompt_leakage, refusal, response_class, over_refused, manual_review,
       review_reason, decided_by,
       error, blocked_by, latency_ms,
       count(*) OVER () AS total
FROM case_results
ORDER BY case_id
LIMIT 2000
