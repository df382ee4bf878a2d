"""What the API, the worker and each job kind read of the operator's configuration: the settings
(`settings.py`, MATHRL_* environment variables; the blocks of what runs jobs, the worker's, vLLM's,
Ray's and the GPUs' memory, in `worker_settings.py`) and where a dataset may come from (`sources.py`).
A floor of its own, under the kinds and over the trainers and the evaluator, which get settings
as arguments."""
