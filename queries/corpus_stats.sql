-- Corpus breakdown (`pieval corpus stats`): one row per (dimension, value) with its case
-- count, over the `attack_cases` table (the streamed, validated corpus).
-- One scan: each case is unnested into one (dimension, value) pair per breakdown column.
-- An absent value is reported as '(none)'.
SELECT
    pair['dimension']                AS dimension,
    coalesce(pair['value'], '(none)') AS value,
    count(*)                          AS cases
FROM (
    SELECT unnest(make_array(
        named_struct('dimension', 'attack_family',   'value', attack_family),
        named_struct('dimension', 'attack_surface',  'value', attack_surface),
        named_struct('dimension', 'attack_category', 'value', attack_category),
        named_struct('dimension', 'severity',        'value', severity),
        named_struct('dimension', 'source_name',     'value', source_name),
        named_struct('dimension', 'source_type',     'value', source_type),
        named_struct('dimension', 'language',        'value', language),
        named_struct('dimension', 'label',           'value', label),
        named_struct('dimension', 'benchmark_split', 'value', benchmark_split)
    )) AS pair
    FROM attack_cases
) AS pairs
GROUP BY 1, 2
ORDER BY 1, 3 DESC, 2
