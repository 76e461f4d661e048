-- `pieval detectors eval`, step 1: one detector over every labelled row.
--
-- Inputs
--   labels       one row per labelled response (src/ops/detector_eval.rs): id,
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
WITH computed AS (
    -- each detector once per row; only the chosen one is computed
    SELECT
        l.*,
        p.detector,
        p.rule_id,
        p.threshold,
        CASE WHEN p.detector = 'response_class' THEN pi_response_class(l.response) END
            AS predicted_class,
        CASE WHEN p.detector = 'leakage'
             THEN pi_leakage_score(l.response, l.protected, l.prompt) END AS score
    FROM labels l CROSS JOIN eval_params p
),
verdicts AS (
    SELECT
        c.*,
        CASE c.detector
            WHEN 'refusal'        THEN pi_refusal(c.response)
            WHEN 'response_class' THEN c.predicted_class <> 'compliance'
            WHEN 'leakage'        THEN c.score >= c.threshold
            -- the decision kernel; what the model was given (prompt, goal, task, the
            -- protected system prompt) makes it echo-aware where the row has it
            WHEN 'criteria'       THEN pi_decide(c.response, c.criteria, NULL, c.protected,
                                                 c.prompt, c.goal, c.task)['success']
            WHEN 'rule'           THEN array_has(pi_rule_hits(c.response), c.rule_id)
            WHEN 'injection'      THEN cardinality(pi_rule_hits(c.response)) > 0
            WHEN 'judge'          THEN pi_judge(c.question, c.response, c.goal, c.task)['verdict']
        END AS verdict
    FROM computed c
)
SELECT * EXCLUDE (detector, rule_id, threshold) FROM verdicts
ORDER BY id
