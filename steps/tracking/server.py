"""A tracking server that does not answer stops the lab fast, with one line that says what to do.

MLflow's HTTP client retries a call 7 times with backoff factor 2 and a 120 s timeout: a dead
server costs about 4 minutes per call, and a job makes dozens. The lab's processes get short
defaults instead (store.http_defaults, set where a client is made; a user's own values win), the
Snakefile checks the server before any job (`preflight`), and a job that loses the server mid-run
fails with the same line (`unreachable`, read by steps/core/job.py).

No mlflow import here: the Snakefile calls `preflight` in the `snakemake` process itself.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

from steps.tracking import store

PREFLIGHT_TIMEOUT_S = 5.0

# What a lost server looks like in the exception text (requests' and MLflow's own wording).
_SIGNS = (
    "connection refused",
    "failed to establish a new connection",
    "max retries exceeded",
    "read timed out",
    "connect timeout",
    "connection aborted",
    "remotedisconnected",
    "name or service not known",
)


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def fix_line(uri: str, what: str) -> str:
    """The one line a dead or silent server gets, wherever it is met."""
    return (
        f"the MLflow tracking server {uri} {what}; fix: start it (e.g. `scripts/mlflow-server up`, or "
        "`mlflow server --port PORT`), or drop tracking.uri (and MLFLOW_TRACKING_URI) to log to the "
        "local store results/mlflow.db"
    )


def preflight(configured: str | None = None) -> str | None:
    """None when the tracking store is local or its server answers GET /health within a few
    seconds; else the line that stops the DAG before any job. A 401/403 passes (an auth proxy in
    front of a server: it is there, and MLflow's own calls say more); any other HTTP error means
    something that is not an MLflow server answers there."""
    uri = store.tracking_uri(configured)
    if not is_server(uri):
        return None
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=PREFLIGHT_TIMEOUT_S):
            return None
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return None
        return fix_line(uri, f"answers GET /health with HTTP {exc.code} (not an MLflow server?)")
    except (OSError, ValueError) as exc:  # refused, timed out, unknown host, malformed address
        reason = getattr(exc, "reason", None) or exc
        if isinstance(reason, ssl.SSLError):  # it answered; TLS trust is MLflow's settings' business
            return None
        return fix_line(uri, f"does not answer ({reason})")


def unreachable(exc: BaseException, uri: str | None) -> str | None:
    """The one line for a job whose MLflow call failed because its server is gone, else None: the
    error names a request to the server's address (MLflow's "API request to <uri>/api/... failed")
    and says the connection failed (a refused gloo rendezvous, say, is not the tracking server)."""
    if not uri or not is_server(uri):
        return None
    address = uri.rstrip("/").lower() + "/"
    seen = exc
    while seen is not None:
        text = str(seen).lower()
        if address in text and any(sign in text for sign in _SIGNS):
            return fix_line(uri, "stopped answering during the job")
        seen = seen.__cause__ or seen.__context__
    return None
