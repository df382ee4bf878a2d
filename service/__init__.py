"""Glue shared by the API and the worker: settings, and the embedded all-in-one launcher."""
