-- `pieval runs diff A B`: the cases whose attack_success or prompt_leakage differ
-- between two runs' case results (tables `a` and `b`), and the case ids present in one
-- run only. One row per difference: case_id, field, the value in a, the value in b.
WITH j AS (
    SELECT coalesce(a.case_id, b.case_id) AS case_id,
           a.case_id IS NOT NULL AS in_a, b.case_id IS NOT NULL AS in_b,
           a.attack_success AS a_s, b.attack_success AS b_s,
           a.prompt_leakage AS a_l, b.prompt_leakage AS b_l
    FROM a FULL OUTER JOIN b ON a.case_id = b.case_id
)
SELECT case_id, 'attack_success' AS field, a_s AS va, b_s AS vb FROM j
  WHERE in_a AND in_b AND a_s IS DISTINCT FROM b_s
UNION ALL
SELECT case_id, 'prompt_leakage', a_l, b_l FROM j
  WHERE in_a AND in_b AND a_l IS DISTINCT FROM b_l
UNION ALL
SELECT case_id, CASE WHEN in_a THEN 'only_in_a' ELSE 'only_in_b' END, NULL, NULL FROM j
  WHERE NOT (in_a AND in_b)
ORDER BY 2, 1
