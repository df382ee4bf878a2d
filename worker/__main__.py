"""`python -m worker` starts a worker: see service.cli for the options."""

from service.cli import app

if __name__ == "__main__":
    app(["worker"])
