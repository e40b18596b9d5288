from tests.rayserver import ray_head  # noqa: F401  (a module-scoped fixture, re-exported for pytest)
