"""Training on TRL: reward models, GRPO, SFT. Knows nothing of the database, Celery or HTTP."""
