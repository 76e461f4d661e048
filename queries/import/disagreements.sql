-- The rows where an imported tool's verdict and pieval's differ, or pieval left the row
-- undecided (`pieval sql "SELECT * FROM verdict_disagreements"`): the cheapest place to
-- see where a tool's detectors are wrong (an echo counted as obeyed, a refusal that
-- quotes the payload) or where pieval's criteria are.
--
-- Input: case_results (an imported run's rows carry source_tool, source_verdict,
-- source_detector, source_score and source_ref, the file and line of the row).
SELECT run_id, source_tool, case_id, attempt_id, attack_family,
       source_detector, source_verdict, source_score,
       attack_success, decided_by, review_reason, matched_rule,
       CASE WHEN source_verdict AND attack_success IS NULL THEN 'pieval_undecided'
            WHEN source_verdict THEN 'source_only'
            WHEN attack_success THEN 'pieval_only'
            ELSE 'pieval_undecided' END AS kind,
       source_ref,
       substr(response_text, 1, 200) AS response_excerpt
FROM case_results
WHERE source_verdict IS NOT NULL
  AND (attack_success IS NULL OR attack_success <> source_verdict)
ORDER BY run_id, source_ref
