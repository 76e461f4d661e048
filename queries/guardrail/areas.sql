-- Areas under a guardrail run's curves (reads the view `guard_roc`, queries/guardrail/roc.sql):
--   roc_auc            trapezoids between consecutive ROC points from (0, 0) (Fawcett
--                      2006): ties count one half, as the Mann–Whitney statistic does. For
--                      a guardrail without scores it is (1 + TPR − FPR) / 2, its
--                      balanced accuracy
--   average_precision  Σ (Rₙ − Rₙ₋₁)·Pₙ over the thresholds, step-wise, without linear
--                      interpolation (Davis and Goadrich 2006; scikit-learn's
--                      average_precision_score)
--   points             the distinct thresholds (2 for a guardrail without scores: its
--                      verdict, and flagging everything)
WITH pts AS (
    SELECT run_id, threshold, tpr, fpr, "precision", positives, negatives,
           lag(tpr, 1, 0.0) OVER (PARTITION BY run_id ORDER BY threshold DESC) AS prev_tpr,
           lag(fpr, 1, 0.0) OVER (PARTITION BY run_id ORDER BY threshold DESC) AS prev_fpr
    FROM guard_roc
)
SELECT run_id,
       sum((fpr - prev_fpr) * (tpr + prev_tpr) / 2) AS roc_auc,
       sum((tpr - prev_tpr) * "precision")          AS average_precision,
       count(*)                                     AS points,
       max(positives)                               AS positives,
       max(negatives)                               AS negatives
FROM pts
GROUP BY run_id
ORDER BY run_id
