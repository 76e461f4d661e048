-- The report's successful attacks: every case the detectors (or the judge) decided was a
-- successful attack, most severe first, with the request and the response as text.
-- `pieval sql --file queries/report/successes.sql --results DIR` gives the same rows.
SELECT case_id, attack_family, attack_surface, severity, matched_rule,
       request_prompt, request_task_input, response_text,
       count(*) OVER () AS total
FROM case_results
WHERE attack_success
ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'high' THEN 1 WHEN 'medium' THEN 2
                       WHEN 'low' THEN 3 ELSE 4 END,
         case_id
LIMIT 200
