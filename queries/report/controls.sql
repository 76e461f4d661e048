-- The report's controls (from the run's controls/controls.parquet when `pieval controls`
-- ran): status, measured value, threshold and the evidence behind each.
SELECT control_id, title, status, statistic, comparator, threshold, measured, n, k,
       ci_low, ci_high, group_key, evidence_rows, signed
FROM controls
ORDER BY control_id
