"""mathrl SDK: the wire schemas shared by every part of the service, the HTTP client and the CLI.

This package imports nothing of the server (no torch, Celery or SQLAlchemy).
"""

from mathrl.client import AsyncClient, Client, MathRLError
from mathrl.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
)
from mathrl.specs import EvalSpec, GRPOSpec, JobSpec, RewardModelSpec, parse_spec

__all__ = [
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "ConflictError",
    "EvalSpec",
    "GRPOSpec",
    "InternalServerError",
    "JobSpec",
    "MathRLError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RewardModelSpec",
    "UnprocessableEntityError",
    "parse_spec",
]
__version__ = "0.1.0"
