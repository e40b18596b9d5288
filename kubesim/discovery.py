"""Discovery: /version, health, /api and /apis (plain and aggregated apidiscovery.k8s.io/v2), the
resource lists per group/version, and a minimal OpenAPI v3 document that tells kubectl the server
validates fields itself."""

from __future__ import annotations

from kubesim.handlerbase import HandlerBase
from kubesim.registry import ResourceType
from kubesim.store import Obj

_DISCOVERY_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def _accepts_discovery_v2(accept: str) -> bool:
    """Whether the client asks for aggregated discovery (apidiscovery.k8s.io/v2) before plain JSON."""
    for part in accept.split(","):
        params = dict(p.strip().partition("=")[::2] for p in part.split(";")[1:])
        if params.get("as") == "APIGroupDiscoveryList" and params.get("g") == "apidiscovery.k8s.io":
            if params.get("v") == "v2":
                return True
            continue
        return False
    return False


class DiscoveryHandler(HandlerBase):
    """The request handler's discovery answers."""

    # ------------------------------------------------------------------ discovery
    def _discovery(self, path: str) -> bool:
        reg = self.sim.registry
        accept = self.headers.get("Accept", "")
        v2 = self.sim.settings.aggregated_discovery and _accepts_discovery_v2(accept)
        if path in ("/healthz", "/readyz", "/livez"):
            self._send(200, b"ok", "text/plain; charset=utf-8")
            return True
        if path == "/version":
            major, minor = self.sim.settings.git_version.lstrip("v").split(".")[:2]
            self._json(
                200,
                {
                    "major": major,
                    "minor": minor,
                    "gitVersion": self.sim.settings.git_version,
                    "gitCommit": "taugrid-simulator",
                    "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z",
                    "goVersion": "go1.23",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
            return True
        if path == "/api":
            self._maybe_fault("discovery", "", "")
            if v2:
                self._json(200, self._aggregated(core=True), _DISCOVERY_V2)
            else:
                self._json(
                    200,
                    {
                        "kind": "APIVersions",
                        "versions": ["v1"],
                        "serverAddressByClientCIDRs": [
                            {"clientCIDR": "0.0.0.0/0", "serverAddress": self.headers.get("Host", "")}
                        ],
                    },
                )
            return True
        if path == "/apis":
            self._maybe_fault("discovery", "", "")
            if v2:
                self._json(200, self._aggregated(core=False), _DISCOVERY_V2)
            else:
                self._json(
                    200,
                    {
                        "kind": "APIGroupList",
                        "apiVersion": "v1",
                        "groups": [self._api_group(g, vs) for g, vs in reg.groups().items() if g],
                    },
                )
            return True
        if path == "/api/v1":
            self._maybe_fault("discovery", "", "")
            self._json(200, self._resource_list("", "v1"))
            return True
        if path == "/openapi/v3":
            index = {
                (f"apis/{g}/{v}" if g else "api/v1"): {
                    "serverRelativeURL": f"/openapi/v3/{'apis/' + g + '/' + v if g else 'api/v1'}?hash=sim"
                }
                for g, vs in reg.groups().items()
                for v in vs
            }
            self._json(200, {"paths": index})
            return True
        if path.startswith("/openapi/v3/"):
            gv = path[len("/openapi/v3/") :]
            group, version = ("", "v1") if gv == "api/v1" else (gv.split("/")[1:3] + [""])[:2]
            types = reg.in_group_version(group, version) if gv.count("/") in (1, 2) else []
            if not types:
                return False
            self._json(200, self._openapi_v3(group, version, types))
            return True
        parts = path.split("/")
        if len(parts) == 3 and parts[1] == "apis":
            versions = reg.groups().get(parts[2])
            if not versions:
                return False
            self._json(200, self._api_group(parts[2], versions))
            return True
        if len(parts) == 4 and parts[1] == "apis":
            if not reg.in_group_version(parts[2], parts[3]):
                return False
            self._maybe_fault("discovery", "", "")
            self._json(200, self._resource_list(parts[2], parts[3]))
            return True
        return False

    @staticmethod
    def _api_group(group: str, versions: list[str]) -> Obj:
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": gvs,
            "preferredVersion": gvs[0],
        }

    @staticmethod
    def _subresources(rt: ResourceType) -> list[tuple[str, list[str]]]:
        subs: list[tuple[str, list[str]]] = []
        if rt.status_subresource:
            subs.append(("status", ["get", "patch", "update"]))
        if rt.key == "/v1/pods":
            subs += [("log", ["get"]), ("binding", ["create"])]
        return subs

    def _resource_list(self, group: str, version: str) -> Obj:
        resources: list[Obj] = []
        for rt in self.sim.registry.in_group_version(group, version):
            entry: Obj = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": list(rt.verbs),
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            for sub, verbs in self._subresources(rt):
                kind = "Binding" if sub == "binding" else rt.kind
                resources.append(
                    {
                        "name": f"{rt.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": kind,
                        "verbs": verbs,
                    }
                )
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}

    @staticmethod
    def _openapi_v3(group: str, version: str, types: list[ResourceType]) -> Obj:
        """A minimal OpenAPI v3 document: write operations per kind, tagged with group/version/kind and
        declaring the `fieldValidation` parameter, plus one open schema per kind.

        kubectl reads it to learn that the server validates fields itself and needs no client schema.
        """
        params = [
            {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            for n in ("dryRun", "fieldManager", "fieldValidation")
        ]
        schemas: Obj = {}
        paths: Obj = {}
        prefix = f"/apis/{group}/{version}" if group else "/api/v1"
        for rt in types:
            gvk = [{"group": group, "version": version, "kind": rt.kind}]
            name = f"{'.'.join(reversed(group.split('.'))) if group else 'io.k8s.api.core'}.{version}.{rt.kind}"
            ref = {"$ref": f"#/components/schemas/{name}"}
            schemas[name] = {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "x-kubernetes-group-version-kind": gvk,
            }

            def op(action: str, rt: ResourceType = rt, gvk: list[Obj] = gvk, ref: Obj = ref) -> Obj:
                return {
                    "operationId": f"{action}{rt.kind}",
                    "parameters": params,
                    "responses": {"200": {"content": {"application/json": {"schema": ref}}}},
                    "x-kubernetes-action": action,
                    "x-kubernetes-group-version-kind": gvk[0],
                }

            base = f"{prefix}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{prefix}/{rt.plural}"
            paths[base] = {"post": op("post"), "get": op("list")}
            paths[base + "/{name}"] = {
                "get": op("get"),
                "put": op("put"),
                "patch": op("patch"),
                "delete": op("delete"),
            }
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes (taugrid simulator)", "version": "v1"},
            "paths": paths,
            "components": {"schemas": schemas},
        }

    def _aggregated(self, core: bool) -> Obj:
        items: list[Obj] = []
        for group, versions in self.sim.registry.groups().items():
            if (group == "") != core:
                continue
            vers: list[Obj] = []
            for version in versions:
                res: list[Obj] = []
                for rt in self.sim.registry.in_group_version(group, version):
                    kind = {"group": group, "version": version, "kind": rt.kind}
                    entry: Obj = {
                        "resource": rt.plural,
                        "responseKind": kind,
                        "scope": "Namespaced" if rt.namespaced else "Cluster",
                        "singularResource": rt.singular,
                        "verbs": list(rt.verbs),
                    }
                    if rt.short_names:
                        entry["shortNames"] = list(rt.short_names)
                    if rt.categories:
                        entry["categories"] = list(rt.categories)
                    subs = self._subresources(rt)
                    if subs:
                        entry["subresources"] = [
                            {
                                "subresource": s,
                                "verbs": v,
                                "responseKind": {**kind, "kind": "Binding" if s == "binding" else rt.kind},
                            }
                            for s, v in subs
                        ]
                    res.append(entry)
                vers.append({"version": version, "resources": res, "freshness": "Current"})
            items.append({"metadata": {"name": group, "creationTimestamp": None}, "versions": vers})
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        }
