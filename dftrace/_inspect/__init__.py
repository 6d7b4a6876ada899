"""Looking inside a run: capturing uses (:mod:`.capturing`), the value summaries they
record (:mod:`.values`), in-memory traces (:mod:`.memory`), browsing a trace as
objects (:mod:`.browse`) and instrumenting code without editing it
(:mod:`.instrument`)."""
