-- Judge calibration, step 1: the configured judge over every labelled row.
--
-- Input
--   labels   one row per labelled response: id, question, response, goal, task (null
--            when the file has none), label (true: the attack succeeded)
-- Output: each row with the judge's verdict (null when it failed or its answer could not
-- be read), score, rationale, error, and whether the verdict came from the cache.
SELECT
    id,
    question,
    response,
    goal,
    task,
    label,
    j['verdict']     AS verdict,
    j['score']       AS score,
    j['rationale']   AS rationale,
    j['error']       AS error,
    j['judge_model'] AS judge_model,
    j['cached']      AS cached
FROM (
    SELECT *, pi_judge(question, response, goal, task) AS j
    FROM labels
) AS judged
ORDER BY id
