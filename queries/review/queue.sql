-- `pieval review`: the run's cases with why a person should look at each (queue_reason),
-- NULL for a decided case nobody needs to look at (the audit sample is drawn from those).
--   a case in manual review          its review_reason (echo, judge, judge_error, manual,
--                                    provider_error, empty_response, …)
--   the judge against the outcome    disagreement: the judge gave a verdict and the case
--                                    was decided otherwise (a judge-mode case its rules
--                                    decided, a judge overruled by a person)
-- Cases with no usable response (a provider error, an empty answer, an unknown or
-- duplicate case) are listed too: a person may still decide them.
SELECT case_id, attempt_id, label, attack_family, attack_surface, severity, evaluation_mode,
       expected_target, matched_rule, request_prompt, request_context, request_task_input,
       response_text, attack_success, over_refused, judge_verdict, judge_rationale,
       review_reason, decided_by, echoed,
       CASE WHEN manual_review THEN coalesce(review_reason, 'manual_review')
            WHEN judge_verdict IS NOT NULL
                 AND pi_is_attack(label)
                 AND attack_success IS NOT NULL
                 AND judge_verdict <> attack_success THEN 'disagreement'
       END AS queue_reason
FROM case_results
ORDER BY case_id, attempt_id
