-- The worst of a guardrail run, 20 of each per run: the misses (injections let through,
-- lowest score first) and the false alarms (benign texts flagged, hard-benign texts
-- first, then highest score). Ties by item id, so the list is the same on every run.
WITH wrong AS (
    SELECT run_id, item_id, label, hard_benign, family, surface, language, converter,
           role, form, source, score, category, text,
           CASE WHEN label THEN 'miss' ELSE 'false_alarm' END              AS kind,
           -- the order within a kind, computed before it is ranked on
           CASE WHEN hard_benign THEN 0 ELSE 1 END                          AS hard_first,
           CASE WHEN label THEN coalesce(score, 0.0)
                ELSE -coalesce(score, 1.0) END                              AS badness
    FROM guard_results
    WHERE (label AND flagged = false) OR (NOT label AND flagged)
),
ranked AS (
    SELECT *,
           row_number() OVER (PARTITION BY run_id, kind
                              ORDER BY hard_first, badness, item_id) AS k
    FROM wrong
)
SELECT run_id, kind, k AS "rank", item_id, hard_benign, family, surface, language,
       converter, role, form, source, score, category, text
FROM ranked
WHERE k <= 20
ORDER BY run_id, kind, k
