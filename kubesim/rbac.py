"""Bearer-token users and RBAC-style authorization, answered as kube-apiserver answers.

Off until a user is added: then a request with `Authorization: Bearer TOKEN` of a known user is
allowed only what that user's rules allow (allow-only, as RBAC is: a request no rule allows is
refused), and an unknown token is 401 Unauthorized. A request without a token stays the
simulator's admin (its scenario engine and the tests' own clients), as before.

Refusals are the API server's Status objects: 403 `Forbidden`, the message
`pods "p" is forbidden: User "alice" cannot get resource "pods/log" in API group "" in the
namespace "ns"` (`at the cluster scope` for cluster-wide requests), details `{name, group, kind}`
with `kind` the resource. Every authenticated user may read discovery and `/version`
(system:discovery, system:public-info-viewer).

    # a researcher who may read her namespace's objects but not its pods' logs (RBAC has no deny:
    # what no rule names is refused)
    sim.rbac.add_user("alice", "alice-token",
                      [Rule(READ_VERBS, ("pods", "jobs", "events"), ("", "batch", "events.k8s.io"), ("research",))])
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from kubesim.errors import ApiError

READ_VERBS = ("get", "list", "watch")


@dataclass(frozen=True, slots=True)
class Rule:
    """One PolicyRule: `verbs` on `resources` ("pods", "pods/log", "workloads"; "*" any) of `groups`
    ("" the core group; "*" any), in `namespaces` (empty: every namespace and the cluster scope)."""

    verbs: tuple[str, ...]
    resources: tuple[str, ...]
    groups: tuple[str, ...] = ("*",)
    namespaces: tuple[str, ...] = ()

    def allows(self, verb: str, group: str, resource: str, namespace: str) -> bool:
        return ((verb in self.verbs or "*" in self.verbs)
                and (group in self.groups or "*" in self.groups)
                and (resource in self.resources or "*" in self.resources)  # "*": subresources too, as in RBAC
                and (not self.namespaces or namespace in self.namespaces))


@dataclass(slots=True)
class User:
    name: str
    rules: list[Rule] = field(default_factory=list)


class Rbac:
    def __init__(self) -> None:
        self._users: dict[str, User] = {}
        self._lock = threading.Lock()

    def add_user(self, name: str, token: str, rules: list[Rule]) -> User:
        if not token:
            raise ValueError("a user needs a token")
        user = User(name, list(rules))
        with self._lock:
            self._users[token] = user
        return user

    def authenticate(self, authorization: str | None) -> User | None:
        """The request's user; None for the admin (no token). An unknown token is 401."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        with self._lock:
            user = self._users.get(token.strip()) if scheme.lower() == "bearer" else None
            enabled = bool(self._users)
        if user is None and enabled:
            raise ApiError(401, "Unauthorized", reason="Unauthorized")
        return user

    @staticmethod
    def authorize(user: User | None, verb: str, group: str, resource: str, subresource: str, namespace: str,
                  name: str) -> None:
        """Raise the API server's 403 unless a rule of `user` allows the request."""
        if user is None:
            return
        full = f"{resource}/{subresource}" if subresource else resource
        if any(r.allows(verb, group, full, namespace) for r in user.rules):
            return
        qualified = f"{resource}.{group}" if group else resource
        subject = f'{qualified} "{name}"' if name else qualified
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        details: dict[str, str] = {"kind": resource}
        if name:
            details["name"] = name
        if group:
            details["group"] = group
        raise ApiError(403, f'{subject} is forbidden: User "{user.name}" cannot {verb} resource "{full}" '
                            f'in API group "{group}" {scope}', reason="Forbidden", details=details)
