-- The report's successful attacks: every case the detectors (or the judge) decided was a
-- successful attack, most severe first, with the request and the response as text.
-- `pieval sql --file queries/report/successes.sql --results DIR` gives the same rows.
-- Texts are cut at 4,000 characters (their full length is given): the page stays small
-- whatever the answers hold; the whole text is in case_results.parquet.
SELECT case_id, attack_family, attack_surface, severity, matched_rule,
       left(request_prompt, 4000) AS request_prompt,
       character_length(request_prompt) AS request_chars,
       left(request_task_input, 4000) AS request_task_input,
       character_length(request_task_input) AS task_input_chars,
       left(response_text, 4000) AS response_text,
       character_length(response_text) AS response_chars,
       count(*) OVER () AS total
FROM case_results
WHERE attack_success
ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'high' THEN 1 WHEN 'medium' THEN 2
                       WHEN 'low' THEN 3 ELSE 4 END,
         case_id
LIMIT 200
