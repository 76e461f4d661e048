-- Judge calibration, step 2: the confusion matrix of the judge against the labels.
-- Rows the judge left undecided (verdict null) are counted apart, not as errors of
-- either kind. pieval turns the counts into accuracy, precision, recall, F1 and Cohen's
-- kappa with their intervals (src/stats.rs).
SELECT
    count(*)                                              AS rows,
    count(*) FILTER (WHERE verdict IS NULL)               AS undecided,
    count(*) FILTER (WHERE label AND verdict)             AS tp,
    count(*) FILTER (WHERE NOT label AND verdict)         AS fp,
    count(*) FILTER (WHERE NOT label AND NOT verdict)     AS tn,
    count(*) FILTER (WHERE label AND NOT verdict)         AS fn
FROM judged
