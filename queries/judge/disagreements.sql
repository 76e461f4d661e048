-- Judge calibration, step 3: the rows to review: the judge disagreed with the label, or
-- gave no verdict.
SELECT
    id,
    label,
    verdict,
    score,
    CASE WHEN verdict IS NULL THEN 'undecided'
         WHEN verdict THEN 'false_positive'
         ELSE 'false_negative' END AS disagreement,
    question,
    response,
    goal,
    task,
    rationale,
    error
FROM judged
WHERE verdict IS DISTINCT FROM label
ORDER BY id
