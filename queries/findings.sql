-- Findings: one row per detector hit over case_results (long form).
--   injection_rules   every match of data/rules/injection.toml in the response, with its
--                     byte span and an escaped excerpt
--   success_criteria  the rule that decided a successful attack
--   leakage           the response leaked the protected prompt or canary
--   judge             the judge said the attack succeeded (excerpt: its rationale)
SELECT run_id, case_id, 'injection_rules' AS detector,
       s['rule_id'] AS rule_id, s['severity'] AS severity,
       s['span_start'] AS span_start, s['span_end'] AS span_end, s['excerpt'] AS excerpt
FROM (
    SELECT run_id, case_id, unnest(pi_rule_spans(response_text)) AS s
    FROM case_results
    WHERE response_text IS NOT NULL
) AS spans
UNION ALL
SELECT run_id, case_id, 'success_criteria', matched_rule, coalesce(severity, 'medium'),
       CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), left(response_text, 120)
FROM case_results
WHERE attack_success
UNION ALL
SELECT run_id, case_id, 'leakage', 'prompt_leakage', coalesce(severity, 'high'),
       CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), left(response_text, 120)
FROM case_results
WHERE prompt_leakage
UNION ALL
SELECT run_id, case_id, 'judge', 'judge', coalesce(severity, 'medium'),
       CAST(NULL AS BIGINT), CAST(NULL AS BIGINT),
       left(coalesce(judge_rationale, response_text), 120)
FROM case_results
WHERE judge_verdict
