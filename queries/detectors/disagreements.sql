-- `pieval detectors eval`, step 3: the rows to review: the detector disagreed with the
-- label (or, for response_class, with the labelled class), or gave no verdict.
SELECT
    id,
    source,
    split,
    label,
    verdict,
    class,
    predicted_class,
    score,
    CASE WHEN verdict IS NULL THEN 'undecided'
         WHEN verdict IS DISTINCT FROM label THEN
              CASE WHEN verdict THEN 'false_positive' ELSE 'false_negative' END
         ELSE 'class' END AS disagreement,
    response,
    protected,
    prompt,
    criteria,
    question
FROM evaluated
WHERE verdict IS DISTINCT FROM label
   OR (class IS NOT NULL AND predicted_class IS NOT NULL AND class <> predicted_class)
ORDER BY id
