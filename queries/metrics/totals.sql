-- Totals over case_results: rows, attack and benign cases, provider errors, manual-review
-- backlog, cases the judge decided and cases it failed on, echoes left undecided, and
-- latency percentiles (ms): exact (linear interpolation), so the same results give the
-- same figures whatever order their rows were written in (an approximate digest did not).
SELECT
    count(*)                                                       AS total,
    count(*) FILTER (WHERE pi_is_attack(label))   AS attack_cases,
    count(*) FILTER (WHERE label = 'benign')                       AS benign_cases,
    count(*) FILTER (WHERE error IS NOT NULL AND trim(error) <> '') AS errors,
    count(*) FILTER (WHERE manual_review)                          AS manual_review,
    count(*) FILTER (WHERE judge_verdict IS NOT NULL)              AS judged,
    count(*) FILTER (WHERE array_has(pi_review_reasons(review_reason), 'judge_error'))     AS judge_errors,
    -- undecided because the criterion's text was only in a copy of the input
    count(*) FILTER (WHERE array_has(pi_review_reasons(review_reason), 'echo') AND manual_review) AS echoes,
    -- who decided: a reviewer's verdict (pieval review), the judge, the rules
    count(*) FILTER (WHERE decided_by = 'human')                   AS decided_by_human,
    count(*) FILTER (WHERE decided_by = 'judge')                   AS decided_by_judge,
    count(*) FILTER (WHERE decided_by = 'rules')                   AS decided_by_rules,
    percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) AS latency_p50,
    percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) AS latency_p95,
    max(latency_ms)                                                AS latency_max
FROM case_results
