"""mathrl SDK: the wire schemas shared by every part of the service, the HTTP client and the CLI.

This package imports nothing of the server (no torch, Celery or SQLAlchemy).
"""

from mathrl.client import AsyncClient, Client, MathRLError
from mathrl.specs import EvalSpec, GRPOSpec, JobSpec, RewardModelSpec, parse_spec

__all__ = [
    "AsyncClient",
    "Client",
    "EvalSpec",
    "GRPOSpec",
    "JobSpec",
    "MathRLError",
    "RewardModelSpec",
    "parse_spec",
]
__version__ = "0.1.0"
