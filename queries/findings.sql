-- Findings: one row per detector hit (long form), over each batch of the scored stream
-- as it is written: `scored` is a batch of case_results plus rule_spans (score_cases.sql),
-- so findings come from the same pass as the results, without reading them back.
--   injection_rules   every match of data/rules/injection.toml in the response, with its
--                     byte span and an escaped excerpt (pi_rule_spans, from the folding
--                     pi_detect already did)
--   success_criteria  the rule that decided a successful attack
--   leakage           the response leaked the protected prompt or canary
--   judge             the judge said the attack succeeded (excerpt: its rationale)
SELECT run_id, case_id, 'injection_rules' AS detector,
       s['rule_id'] AS rule_id, s['severity'] AS severity,
       s['span_start'] AS span_start, s['span_end'] AS span_end, s['excerpt'] AS excerpt
FROM (
    -- rule_spans is null where the response is (no filter: a filter would copy every
    -- response of the batch only to drop it)
    SELECT run_id, case_id, unnest(rule_spans) AS s
    FROM scored
) AS spans
UNION ALL
SELECT run_id, case_id, 'success_criteria', matched_rule, coalesce(severity, 'medium'),
       CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), left(response_text, 120)
FROM scored
WHERE attack_success
UNION ALL
SELECT run_id, case_id, 'leakage', 'prompt_leakage', coalesce(severity, 'high'),
       CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), left(response_text, 120)
FROM scored
WHERE prompt_leakage
UNION ALL
SELECT run_id, case_id, 'judge', 'judge', coalesce(severity, 'medium'),
       CAST(NULL AS BIGINT), CAST(NULL AS BIGINT),
       left(coalesce(judge_rationale, response_text), 120)
FROM scored
WHERE judge_verdict
