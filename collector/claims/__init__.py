"""Pure claim evaluation: run evidence and a clock in, `RunClaims` out."""

from collector.claims.engine import evaluate, expected_pods

__all__ = ["evaluate", "expected_pods"]
