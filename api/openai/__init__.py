"""What OpenAI's routers (api/routers/openai_*.py) share: each of their resources is a view over the one
job store (`resource.py`), never a store of its own."""
