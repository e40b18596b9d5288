"""The simulator's side door, /_sim/: fault rules (list, add, remove, clear), container log lines
and restarts for pods no kubelet runs, and the store's state (resourceVersion, retained window)."""

from __future__ import annotations

from kubesim.clock import parse_time
from kubesim.errors import ApiError
from kubesim.faults import Fault
from kubesim.handlerbase import HandlerBase


class AdminHandler(HandlerBase):
    """The request handler's /_sim/ admin API."""

    # ------------------------------------------------------------------ admin API
    def _admin(self, path: str, query: dict[str, list[str]]) -> None:
        store = self.sim.store
        parts = [p for p in path.split("/") if p][1:]
        if parts == ["faults"]:
            if self.command == "GET":
                self._json(200, {"faults": [f.to_json() for f in self.sim.faults.rules()]})
            elif self.command == "POST":
                body = self._json_body()
                try:
                    fault = self.sim.faults.add(Fault.from_json(body or {}))
                except (ValueError, TypeError) as exc:
                    raise ApiError.bad_request(str(exc)) from None
                self._json(201, fault.to_json())
            elif self.command == "DELETE":
                self._body()
                self.sim.faults.clear()
                self._json(200, {"faults": []})
            else:
                raise ApiError(405, "use GET, POST or DELETE")
            return
        if len(parts) == 2 and parts[0] == "faults" and self.command == "DELETE":
            ok = self.sim.faults.remove(int(parts[1]))
            if not ok:
                raise ApiError(404, f"no fault {parts[1]}")
            self._json(200, {"removed": int(parts[1])})
            return
        if parts == ["logs"] and self.command == "POST":  # many appends in one request, in order
            entries = (self._json_body() or {}).get("entries")
            if not isinstance(entries, list):
                raise ApiError.bad_request('body must be {"entries": [{"namespace", "pod", "container", "lines", '
                                           '"time"?}, ...]}')
            for e in entries:
                if not isinstance(e, dict) or not isinstance(e.get("lines"), list):
                    raise ApiError.bad_request("each entry needs namespace, pod, container and lines")
            for e in entries:
                when = parse_time(e["time"]) if e.get("time") else None
                store.append_log(str(e["namespace"]), str(e["pod"]), str(e["container"]),
                                 [str(x) for x in e["lines"]], when)
            self._json(200, {"entries": len(entries)})
            return
        if parts and parts[0] == "logs" and len(parts) in (4, 5) and self.command == "POST":
            ns, pod, container = parts[1:4]
            body = self._json_body() or {}
            if len(parts) == 5:
                if parts[4] != "rotate":
                    raise ApiError(404, f"unknown log action {parts[4]}")
                store.rotate_log(ns, pod, container)
                self._json(200, {"rotated": True})
                return
            lines = body.get("lines")
            if not isinstance(lines, list):
                raise ApiError.bad_request('body must be {"lines": [...], "time": RFC3339?}')
            when = parse_time(body["time"]) if body.get("time") else None
            kept = store.append_log(ns, pod, container, [str(x) for x in lines], when)
            self._json(200, {"lines": kept})
            return
        if parts == ["state"] and self.command == "GET":
            self._json(
                200,
                {
                    "resourceVersion": store.resource_version,
                    "oldestRetained": store.oldest_retained,
                    "time": self.sim.clock.now().isoformat(),
                },
            )
            return
        raise ApiError(404, f"unknown admin path {path}")
