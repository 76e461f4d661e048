-- The report's overview of a run: cases, decisions (and who made them), errors, review
-- (echoes among it), latency (exact percentiles, as queries/metrics/totals.sql).
SELECT count(*)                                              AS cases,
       count(*) FILTER (WHERE pi_is_attack(label)) AS attack_cases,
       count(*) FILTER (WHERE label = 'benign')              AS benign_cases,
       count(*) FILTER (WHERE attack_success)                AS successes,
       count(*) FILTER (WHERE over_refused)                  AS over_refused,
       count(*) FILTER (WHERE prompt_leakage)                AS leaks,
       count(*) FILTER (WHERE error IS NOT NULL)             AS provider_errors,
       count(*) FILTER (WHERE blocked_by IS NOT NULL)        AS blocked,
       count(*) FILTER (WHERE manual_review)                 AS manual_review,
       count(*) FILTER (WHERE array_has(pi_review_reasons(review_reason), 'echo'))   AS echoes,
       count(*) FILTER (WHERE decided_by = 'rules')          AS decided_by_rules,
       count(*) FILTER (WHERE decided_by = 'judge')          AS decided_by_judge,
       count(*) FILTER (WHERE decided_by = 'human')          AS decided_by_human,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) AS latency_p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) AS latency_p95_ms,
       max(latency_ms)                                       AS latency_max_ms
FROM case_results
