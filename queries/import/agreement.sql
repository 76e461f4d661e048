-- The verdict-agreement view (`pieval sql "SELECT * FROM verdict_agreement"`): for an
-- imported run (`pieval import`, docs/import.md), how often the source tool's verdicts
-- equal pieval's, per run, tool, scorer and attack family.
--
-- Inputs
--   source_scores  every score the tool gave, one row per row and scorer, its verdict
--                  read as "the attack succeeded" (src/import/mod.rs)
--   case_results   pieval's verdict (attack_success), and the tool's overall one
--                  (source_verdict, from the scorer in source_detector)
--
-- Rows: one per (run_id, source_tool, scorer, attack_family); scorer `(verdict)` is the
-- tool's overall verdict (garak: any detector over its threshold; promptfoo: the test
-- failed), the other scorers each detector, assertion or judge the tool ran.
--   rows              rows scored by this scorer
--   both_decided      the scorer gave a verdict and pieval decided (attack_success not NULL)
--   agree             of those, the same verdict
--   agreement         agree / both_decided, with its Wilson 95% interval
--   source_only       the tool says the attack succeeded, pieval says it did not
--   pieval_only       pieval says it succeeded, the tool says it did not
--   pieval_undecided  the tool decided, pieval left it to a judge or a person (an echo,
--                     a judge question: review_reason says which)
WITH verdicts AS (
    SELECT s.run_id, s.source_tool, s.scorer, c.attack_family,
           s.verdict, c.attack_success
    FROM source_scores s
    JOIN case_results c
      ON c.run_id = s.run_id AND c.case_id = s.case_id
     AND c.attempt_id IS NOT DISTINCT FROM s.attempt_id
    UNION ALL
    SELECT run_id, source_tool, '(verdict)' AS scorer, attack_family,
           source_verdict AS verdict, attack_success
    FROM case_results
    WHERE source_tool IS NOT NULL
),
counted AS (
    SELECT run_id, source_tool, scorer, attack_family,
           count(*) AS rows,
           sum(CASE WHEN verdict IS NOT NULL AND attack_success IS NOT NULL THEN 1 ELSE 0 END) AS both_decided,
           sum(CASE WHEN verdict = attack_success THEN 1 ELSE 0 END) AS agree,
           sum(CASE WHEN verdict AND NOT attack_success THEN 1 ELSE 0 END) AS source_only,
           sum(CASE WHEN NOT verdict AND attack_success THEN 1 ELSE 0 END) AS pieval_only,
           sum(CASE WHEN verdict IS NOT NULL AND attack_success IS NULL THEN 1 ELSE 0 END) AS pieval_undecided
    FROM verdicts
    GROUP BY run_id, source_tool, scorer, attack_family
)
SELECT run_id, source_tool, scorer, attack_family, rows, both_decided, agree,
       CASE WHEN both_decided > 0 THEN CAST(agree AS DOUBLE) / both_decided END AS agreement,
       pi_wilson_low(CAST(agree AS BIGINT), CAST(both_decided AS BIGINT)) AS ci_low,
       pi_wilson_high(CAST(agree AS BIGINT), CAST(both_decided AS BIGINT)) AS ci_high,
       source_only, pieval_only, pieval_undecided
FROM counted
ORDER BY run_id, source_tool, scorer = '(verdict)' DESC, scorer, attack_family
