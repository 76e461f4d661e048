-- Totals over case_results, from their partial aggregates (`summary_partial`,
-- queries/summary_partial.sql, and `summary_latency`, queries/summary_latency.sql): rows, attack and benign cases, provider errors,
-- manual-review backlog, cases the judge decided and cases it failed on, echoes left
-- undecided, and latency percentiles (ms): exact (linear interpolation) over every
-- value with its count, so the same results give the same figures whatever order their
-- rows were written in and however they were sliced (an approximate digest did not).
SELECT totals.*, latency.*
FROM (
    SELECT
        coalesce(sum(rows), 0)                                    AS total,
        coalesce(sum(rows) FILTER (WHERE pi_is_attack(label)), 0) AS attack_cases,
        coalesce(sum(rows) FILTER (WHERE label = 'benign'), 0)    AS benign_cases,
        coalesce(sum(errors), 0)                                  AS errors,
        coalesce(sum(manual_review), 0)                           AS manual_review,
        coalesce(sum(judged), 0)                                  AS judged,
        coalesce(sum(judge_errors), 0)                            AS judge_errors,
        -- undecided because the criterion's text was only in a copy of the input
        coalesce(sum(echoes), 0)                                  AS echoes,
        -- who decided: a reviewer's verdict (pieval review), the judge, the rules
        coalesce(sum(decided_by_human), 0)                        AS decided_by_human,
        coalesce(sum(decided_by_judge), 0)                        AS decided_by_judge,
        coalesce(sum(decided_by_rules), 0)                        AS decided_by_rules
    FROM summary_partial
) AS totals
CROSS JOIN (
    -- each latency value as many times as it was seen
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY v)  AS latency_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY v) AS latency_p95,
           max(v)                                          AS latency_max
    FROM (
        SELECT unnest(array_repeat(latency_ms, rows)) AS v
        FROM summary_latency
    )
) AS latency
