-- The ROC curve of a guardrail run (the view `guard_roc`): one point per distinct score,
-- highest first; a text is flagged at a threshold when its score is at or above it.
-- Texts with equal scores form one point, never an arbitrary staircase (Fawcett 2006,
-- "An introduction to ROC analysis", Pattern Recognition Letters 27: ties are a
-- diagonal segment). A guardrail that gives no score is scored by its verdict (1
-- flagged, 0 not): its curve has one operating point. Texts without a verdict are left
-- out. tp, fp: texts at or above the threshold; tpr, fpr, precision at that threshold.
WITH pts AS (
    SELECT run_id,
           coalesce(score, CASE WHEN flagged THEN 1.0 ELSE 0.0 END) AS s,
           label
    FROM guard_results
    WHERE flagged IS NOT NULL
),
by_score AS (
    SELECT run_id, s,
           count(*) FILTER (WHERE label)     AS pos,
           count(*) FILTER (WHERE NOT label) AS neg
    FROM pts
    GROUP BY run_id, s
),
totals AS (
    SELECT run_id, sum(pos) AS positives, sum(neg) AS negatives
    FROM by_score
    GROUP BY run_id
),
cum AS (
    SELECT run_id, s,
           sum(pos) OVER (PARTITION BY run_id ORDER BY s DESC
                          ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS tp,
           sum(neg) OVER (PARTITION BY run_id ORDER BY s DESC
                          ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS fp
    FROM by_score
)
SELECT c.run_id,
       c.s                                                             AS threshold,
       c.tp,
       c.fp,
       t.positives - c.tp                                              AS fn,
       t.negatives - c.fp                                              AS tn,
       CASE WHEN t.positives > 0 THEN CAST(c.tp AS DOUBLE) / t.positives END AS tpr,
       CASE WHEN t.negatives > 0 THEN CAST(c.fp AS DOUBLE) / t.negatives END AS fpr,
       CASE WHEN c.tp + c.fp > 0 THEN CAST(c.tp AS DOUBLE) / (c.tp + c.fp) END AS "precision",
       t.positives,
       t.negatives
FROM cum c
JOIN totals t ON c.run_id = t.run_id
