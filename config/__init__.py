"""What the API, the worker and each job kind read of the operator's configuration: the settings
(`settings.py`, MATHRL_* environment variables) and where a dataset may come from (`sources.py`).
A floor of its own, under the kinds and over the trainers and the evaluator, which get settings
as arguments."""
