"""Celery workers: the only place where the store meets the trainer and the evaluator."""
