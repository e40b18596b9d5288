"""API errors rendered as `meta/v1` Status objects, like an API server."""

from __future__ import annotations

from typing import Any

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An error answered as a Status object with an HTTP code and a machine-readable reason."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        # "" is Kubernetes' StatusReasonUnknown: the Status then has no reason at all.
        self.reason = reason if reason is not None else _REASONS.get(code, "Unknown")
        self.details = details
        self.retry_after = retry_after

    def status(self) -> dict[str, Any]:
        """The Status object for this error."""
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if not self.reason:
            del out["reason"]
        if self.details:
            out["details"] = self.details
        return out

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, message)

    @classmethod
    def not_found(cls, resource: str, name: str, group: str = "") -> ApiError:
        qualified = f"{resource}.{group}" if group else resource
        return cls(
            404,
            f'{qualified} "{name}" not found',
            details={"name": name, "group": group, "kind": resource} if name else None,
        )

    @classmethod
    def already_exists(cls, resource: str, name: str, group: str = "") -> ApiError:
        qualified = f"{resource}.{group}" if group else resource
        return cls(
            409,
            f'{qualified} "{name}" already exists',
            reason="AlreadyExists",
            details={"name": name, "group": group, "kind": resource},
        )

    @classmethod
    def conflict(cls, resource: str, name: str, group: str = "") -> ApiError:
        qualified = f"{resource}.{group}" if group else resource
        return cls(
            409,
            f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            reason="Conflict",
            details={"name": name, "group": group, "kind": resource},
        )

    @classmethod
    def expired(cls, message: str) -> ApiError:
        return cls(410, message, reason="Expired")

    @classmethod
    def invalid(cls, kind: str, name: str, causes: list[tuple[str, str]], group: str = "") -> ApiError:
        text = "; ".join(f"{f}: {m}" for f, m in causes)
        return cls(
            422,
            f'{kind}{"." + group if group else ""} "{name}" is invalid: {text}',
            reason="Invalid",
            details={
                "name": name,
                "group": group,
                "kind": kind,
                "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes],
            },
        )
