-- The report's ROC and precision–recall curves of a guardrail run (templates/report.html):
-- the points of `guard_roc` (queries/guardrail/roc.sql), highest threshold first.
SELECT threshold, tpr, fpr, "precision"
FROM guard_roc
ORDER BY threshold DESC
