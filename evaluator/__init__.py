"""Benchmarks as data, generation backends, grading and metrics. Knows nothing of the
database, Celery or HTTP: `run_eval(spec, sink)` is usable as a plain library."""
