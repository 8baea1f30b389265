"""Fixtures for the end-to-end tests: a real MLflow server (tests/fixtures/mlflow_server.py)."""
from fixtures.mlflow_server import mlflow_server, mlflow_server_factory  # noqa: F401 - pytest fixtures
from fixtures.s3_server import _s3_session_server, s3_server  # noqa: F401 - pytest fixtures
from fixtures.gcs_server import _gcs_session_server, gcs_server  # noqa: F401 - pytest fixtures
