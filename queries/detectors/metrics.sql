-- `pieval detectors eval`, step 2: the confusion matrix of the detector against the
-- labels, for every split (dev, test, ...), every source, and all rows. Rows without a
-- verdict are counted apart. pieval adds accuracy, precision, recall and F1 with their
-- intervals (Wilson 95%; F1 by a seeded bootstrap, src/stats.rs).
WITH g AS (
    SELECT 'split' AS dimension, coalesce(split, '(none)') AS value, label, verdict,
           class, predicted_class
    FROM evaluated
    UNION ALL
    SELECT 'source', coalesce(source, '(none)'), label, verdict, class, predicted_class
    FROM evaluated
    UNION ALL
    SELECT 'all', 'all', label, verdict, class, predicted_class FROM evaluated
)
SELECT
    dimension,
    value,
    count(*)                                          AS rows,
    count(*) FILTER (WHERE verdict IS NULL)           AS undecided,
    count(*) FILTER (WHERE label AND verdict)         AS tp,
    count(*) FILTER (WHERE NOT label AND verdict)     AS fp,
    count(*) FILTER (WHERE NOT label AND NOT verdict) AS tn,
    count(*) FILTER (WHERE label AND NOT verdict)     AS fn,
    -- three classes: rows labelled with a class, and those the detector got exactly
    count(*) FILTER (WHERE class IS NOT NULL AND predicted_class IS NOT NULL) AS class_rows,
    count(*) FILTER (WHERE class = predicted_class)   AS class_agree
FROM g
GROUP BY dimension, value
ORDER BY dimension, value
