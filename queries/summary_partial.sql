-- The partial aggregates of a summary: what queries/summary.sql and
-- queries/metrics/totals.sql need of any slice of case_results, as counts that add up
-- over slices. A scoring computes them from its scored stream as it goes (and each
-- executor of a cluster from its own part), so the summary never reads the written
-- results back; over a whole table they are the view `summary_partial`. Partials of
-- several slices are simply put together: the two queries add them up.
--
-- One row per group of result rows, with the counts of true and of decided
-- (non-NULL) values of each outcome. A row outside an attack section's trials is a trial
-- of its own and needs only its dimensions, so those rows are grouped by dimensions
-- alone (a corpus has few combinations). A trial's attempts (attempt_id) and an adaptive
-- case's trials (attack_pipeline, attack_strategy) are combined over the whole run by
-- the summary, so those rows keep their case_id. The latencies have their own partials
-- (queries/summary_latency.sql).
SELECT
    CASE WHEN attempt_id IS NOT NULL OR attack_pipeline IS NOT NULL
              OR attack_strategy IS NOT NULL THEN case_id END AS case_id,
    attempt_id IS NOT NULL AS attempts,
    label, attack_family, attack_surface, attack_category, severity,
    attack_pipeline, attack_strategy,
    owasp_llm, owasp_agentic, mitre_atlas, nist_ai_600_1,
    agent_stop IS NOT NULL AS is_agent,
    count(*) AS rows,
    count(attack_success)                           AS success_n,
    count(*) FILTER (WHERE attack_success)          AS success_k,
    count(prompt_leakage)                           AS leakage_n,
    count(*) FILTER (WHERE prompt_leakage)          AS leakage_k,
    count(refusal)                                  AS refusal_n,
    count(*) FILTER (WHERE refusal)                 AS refusal_k,
    count(over_refused)                             AS over_refused_n,
    count(*) FILTER (WHERE over_refused)            AS over_refused_k,
    count(utility_success)                          AS utility_n,
    count(*) FILTER (WHERE utility_success)         AS utility_k,
    count(injection_delivered)                      AS delivered_n,
    count(*) FILTER (WHERE injection_delivered)     AS delivered_k,
    -- totals.sql's counts
    count(*) FILTER (WHERE error IS NOT NULL AND trim(error) <> '')                  AS errors,
    count(*) FILTER (WHERE manual_review)                                            AS manual_review,
    count(judge_verdict)                                                             AS judged,
    count(*) FILTER (WHERE array_has(pi_review_reasons(review_reason), 'judge_error')) AS judge_errors,
    count(*) FILTER (WHERE array_has(pi_review_reasons(review_reason), 'echo') AND manual_review) AS echoes,
    count(*) FILTER (WHERE decided_by = 'human')                                     AS decided_by_human,
    count(*) FILTER (WHERE decided_by = 'judge')                                     AS decided_by_judge,
    count(*) FILTER (WHERE decided_by = 'rules')                                     AS decided_by_rules
FROM case_results
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14
