"""The job secret every coordinator service checks (one check, shared by the four servicers)."""
import hmac

import grpc


def require_secret(given, expected, context):
    """Aborts the RPC with PERMISSION_DENIED unless ``given`` is the job's secret (constant-time comparison)."""
    if not given or not hmac.compare_digest(given.encode(), expected.encode()):
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "missing or wrong job secret")
