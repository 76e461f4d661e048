-- `pieval runs diff A B`: the cases whose attack_success, prompt_leakage, (benign
-- controls) over_refused or (agents) utility_success differ
-- between two runs' case results (tables `a` and `b`), and the case ids present in one
-- run only. One row per difference: case_id, field, the value in a, the value in b.
--
-- Runs compare case by case. A run with an attack section (several attempts per case:
-- converter pipelines, best_of_n variants, strategies; src/attack/mod.rs) counts a case
-- as successful when any attempt succeeded, false when every attempt is decided false,
-- NULL otherwise; a static run has one row per case and keeps its values. So a static
-- run compares with an adaptive one: which cases the adaptive attacks broke.
WITH per_case AS (
    SELECT side, case_id,
           CASE WHEN bool_or(attack_success) THEN true
                WHEN count(attack_success) = count(*) THEN false END AS s,
           CASE WHEN bool_or(prompt_leakage) THEN true
                WHEN count(prompt_leakage) = count(*) THEN false END AS l,
           -- a control counts as over-refused when every attempt was
           CASE WHEN count(over_refused) = count(*) THEN bool_and(over_refused) END AS o,
           -- an agent's task counts as done when every attempt did it
           CASE WHEN count(utility_success) = count(*) THEN bool_and(utility_success) END AS u
    FROM (SELECT 'a' AS side, case_id, attack_success, prompt_leakage, over_refused,
                 utility_success FROM a
          UNION ALL
          SELECT 'b', case_id, attack_success, prompt_leakage, over_refused, utility_success
          FROM b)
    GROUP BY side, case_id
),
j AS (
    SELECT coalesce(ca.case_id, cb.case_id) AS case_id,
           ca.case_id IS NOT NULL AS in_a, cb.case_id IS NOT NULL AS in_b,
           ca.s AS a_s, cb.s AS b_s,
           ca.l AS a_l, cb.l AS b_l,
           ca.o AS a_o, cb.o AS b_o,
           ca.u AS a_u, cb.u AS b_u
    FROM (SELECT * FROM per_case WHERE side = 'a') ca
    FULL OUTER JOIN (SELECT * FROM per_case WHERE side = 'b') cb ON ca.case_id = cb.case_id
)
SELECT case_id, 'attack_success' AS field, a_s AS va, b_s AS vb FROM j
  WHERE in_a AND in_b AND a_s IS DISTINCT FROM b_s
UNION ALL
SELECT case_id, 'prompt_leakage', a_l, b_l FROM j
  WHERE in_a AND in_b AND a_l IS DISTINCT FROM b_l
UNION ALL
SELECT case_id, 'over_refused', a_o, b_o FROM j
  WHERE in_a AND in_b AND a_o IS DISTINCT FROM b_o
UNION ALL
SELECT case_id, 'utility_success', a_u, b_u FROM j
  WHERE in_a AND in_b AND a_u IS DISTINCT FROM b_u
UNION ALL
SELECT case_id, CASE WHEN in_a THEN 'only_in_a' ELSE 'only_in_b' END, NULL, NULL FROM j
  WHERE NOT (in_a AND in_b)
ORDER BY 2, 1
