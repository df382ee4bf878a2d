"""The programs on top: `mathrl-server` (`cli.py`), the embedded all-in-one launcher, the demos,
the GPU acceptance run and the python graders' pool. Their settings live below, in `config/`."""
