-- `pieval detectors eval`, step 1: one detector over every labelled row.
--
-- Inputs
--   labels       one row per labelled response (src/engine/detector_eval.rs): id,
--                source, split, response, label (true: the detector should fire),
--                class (refusal / deflection / compliance, when the labels are classes),
--                protected (the system prompt or secret), prompt (what the user sent:
--                a secret the user wrote is not leaked by being repeated), criteria
--                (success_criteria JSON), question, goal, task (for the judge)
--   eval_params  one row: detector (refusal, response_class, leakage, criteria, rule,
--                injection, judge), rule_id (for `rule`), threshold (leakage)
-- Output: each row with the detector's verdict (a boolean; for response_class, whether
-- the class is not compliance) and, for response_class, the predicted class. The
-- verdict is NULL where the detector gave none (a judge that failed).
WITH verdicts AS (
    SELECT
        l.*,
        CASE p.detector
            WHEN 'refusal'        THEN pi_refusal(l.response)
            WHEN 'response_class' THEN pi_response_class(l.response) <> 'compliance'
            WHEN 'leakage'        THEN pi_leakage_score(l.response, l.protected, l.prompt) >= p.threshold
            WHEN 'criteria'       THEN pi_criteria_match(l.response, l.criteria)
            WHEN 'rule'           THEN array_has(pi_rule_hits(l.response), p.rule_id)
            WHEN 'injection'      THEN cardinality(pi_rule_hits(l.response)) > 0
            WHEN 'judge'          THEN pi_judge(l.question, l.response, l.goal, l.task)['verdict']
        END AS verdict,
        CASE WHEN p.detector = 'response_class' THEN pi_response_class(l.response) END
            AS predicted_class,
        CASE WHEN p.detector = 'leakage' THEN pi_leakage_score(l.response, l.protected, l.prompt) END
            AS score
    FROM labels l CROSS JOIN eval_params p
)
SELECT * FROM verdicts
ORDER BY id
