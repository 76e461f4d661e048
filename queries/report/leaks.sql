-- The report's leakage examples: responses that leaked the protected prompt or canary,
-- with the leaked text marked where it appears literally (case-insensitive) as
-- before / leaked / after; when the leak is encoded or partial there is no literal span
-- and the whole response is `before`.
WITH leaked AS (
    SELECT case_id, attack_family, attack_surface, expected_target, response_text,
           CASE WHEN expected_target IS NULL OR expected_target = '' THEN 0
                ELSE strpos(lower(response_text), lower(expected_target)) END AS at,
           count(*) OVER () AS total
    FROM case_results
    WHERE prompt_leakage AND response_text IS NOT NULL
)
-- Each part is cut at 2,000 characters (the text before the leak keeps its end).
SELECT case_id, attack_family, attack_surface, total,
       right(CASE WHEN at > 0 THEN substr(response_text, 1, at - 1) ELSE response_text END, 2000) AS before,
       left(CASE WHEN at > 0 THEN substr(response_text, at, character_length(expected_target)) END, 2000) AS leaked,
       left(CASE WHEN at > 0 THEN substr(response_text, at + character_length(expected_target)) END, 2000) AS after
FROM leaked
ORDER BY case_id
LIMIT 100
