-- The report's controls (from the run's controls/controls.parquet when `pieval controls`
-- ran): status, measured value, threshold and the evidence behind each, and the framework
-- tags of the deciding group (OWASP LLM, OWASP agentic, MITRE ATLAS).
SELECT control_id, title, status, statistic, comparator, threshold, measured, n, k,
       ci_low, ci_high, group_key, evidence_rows, signed,
       nullif(array_to_string(array_concat(owasp_llm, owasp_agentic, mitre_atlas), ' / '), '')
           AS frameworks
FROM controls
ORDER BY control_id
