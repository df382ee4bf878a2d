"""What the tests share, in one place (no test module imports another, nor conftest's internals):

- `env`: the repository root, the datasets, the test services' addresses, the admin token;
- `service`: a real API process and real worker processes (`Service`), and their environment;
- `api`: helpers for the in-process app (`app_client`): keys, one object of each kind, live settings;
- `jobs`: job specs the tests submit, and what a 2-process job must have stored;
- `processes`: waiting for a condition, a job's process and whether it lives;
- `deploy`: the Helm chart rendered and the Dockerfile parsed, as the deploy and image tests read them.

The scripts here (`grpo_loop_run.py`, `resume_run.py`, `vllm_sync_check.py`) are run by tests as
processes of their own."""
