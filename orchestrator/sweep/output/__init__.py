"""What a sweep shows: ``figures`` (every number of the summary, in one pass), ``summary_report``,
``per_load`` and ``adaptive_schedule`` (those numbers in words and JSON), ``plots``, and the
console's ``display`` and ``cost`` lines."""
