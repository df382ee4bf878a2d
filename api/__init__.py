"""FastAPI control plane. Never imports trainer/ or evaluator/ (the API image has no torch)."""
