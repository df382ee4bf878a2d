"""What the Tinker routers (api/routers/tinker.py, api/routers/tinker_runs.py) build on: each
client is a session job, never a store of its own (`common.py`: the caller and the project's
sessions and saves; `lookups.py`, `session_jobs.py`, `futures.py`, `forwarding.py`, `bodies.py`:
the calls; `runs.py`: the RestClient's reads)."""
