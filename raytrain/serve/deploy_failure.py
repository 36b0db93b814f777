"""Why the service did not deploy, in the replica's own words.

Serve's `serve.run` raises only "Deploying application raytrain failed: Failed to update the
deployments ['RaytrainAPI']"; the replica's exception (an import error, say) is in the
deployment's status message. This reads it from `serve.status()` and makes the error the
operator sees.

    raise RaytrainError(deploy_failure(str(exc), replica_errors("raytrain")))
"""

from __future__ import annotations

from ray import serve


def replica_errors(app_name: str) -> list[str]:
    """What Serve knows of why each of the app's deployments failed (the replica's own
    traceback is in the deployment's status message)."""
    try:
        app = serve.status().applications.get(app_name)
    except Exception:  # noqa: BLE001 - the controller itself is gone: nothing more to say
        return []
    if app is None:
        return []
    messages = [f"{name}: {d.message}" for name, d in app.deployments.items() if d.message]
    return messages or ([app.message] if app.message else [])


def deploy_failure(serve_error: str, replica_errors: list[str], tail_lines: int = 25) -> str:
    """The error a failed deploy shows: the replica's own error (its traceback's last lines,
    where the cause is), not only Serve's "Deploying application ... failed".

    >>> deploy_failure("Deploying application raytrain failed", ["RaytrainAPI: boom"])[:40]
    'the service did not start: RaytrainAPI: '
    """
    cause = "\n".join(replica_errors) or serve_error
    lines = cause.strip().splitlines()
    if len(lines) > tail_lines:
        lines = ["...", *lines[-tail_lines:]]
    return ("the service did not start: " + "\n".join(lines) + "\nTo fix: read the error "
            "above; Ray's logs of the replica are kept in the Ray session folder (for a cluster "
            "raytrain started, <state-dir>/ray/session_latest/logs)")
