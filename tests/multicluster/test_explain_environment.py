"""`explain` reports the supported-environment check of a dump: JSON `environment` and a text line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from envobjects import supported_objects, version

from collector.cli import main


def _explain(dump: Path, output: str) -> Any:
    result = CliRunner().invoke(main, ["explain", "--from-dump", str(dump), "--at", "2026-01-10T10:00:00Z",
                                       "-o", output])
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout) if output == "json" else result.stdout


def _dump(tmp_path: Path, git: str, **kw: str) -> Path:
    objs = supported_objects(**kw)
    (tmp_path / "kube-system").mkdir()
    # as `kubectl version -o json`, a Deployment List from the dump and CRDs as multi-document YAML
    (tmp_path / "version.json").write_text(json.dumps({"clientVersion": {"gitVersion": "v1.31.0"},
                                                       "serverVersion": version(git)}))
    deploys = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
               for o in objs if o["kind"] == "Deployment"]
    (tmp_path / "kube-system" / "deployments.json").write_text(
        json.dumps({"kind": "DeploymentList", "apiVersion": "apps/v1", "items": deploys}))
    (tmp_path / "crds.yaml").write_text(yaml.safe_dump_all([o for o in objs if o["kind"] != "Deployment"]))
    return tmp_path


def test_a_supported_dump(tmp_path: Path) -> None:
    out = _explain(_dump(tmp_path, "v1.31.2"), "json")
    env = out["environment"]
    assert env["supported"] is True and env["violations"] == []
    [cluster] = env["clusters"]
    assert cluster["kubernetes"] == "v1.31.2"
    assert cluster["images"] == {"kuberay": ["v1.6.2"], "kueue": ["v0.18.2"], "taugrid": ["0.3.1"]}
    assert cluster["crds"]["rayjobs.ray.io"] == {"served": ["v1"], "storage": "v1"}


def test_an_unsupported_dump_says_why(tmp_path: Path) -> None:
    dump = _dump(tmp_path, "v1.29.3", kuberay="v1.5.1")
    env = _explain(dump, "json")["environment"]
    assert env["supported"] is False
    assert {(v["check"], v["reason"]) for v in env["violations"]} == {
        ("kubernetes", "unsupported"), ("kuberay", "unsupported")}
    text = _explain(dump, "text")
    line = next(x for x in text.splitlines() if x.startswith("environment:"))
    assert "outside the supported contract" in line and "kuberay v1.5.1, supported 1.6.2" in line


def test_a_dump_without_versions_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "nodes.json").write_text(json.dumps({"kind": "NodeList", "apiVersion": "v1", "items": []}))
    env = _explain(tmp_path, "json")["environment"]
    assert env == {"supported": None, "clusters": [], "violations": []}
    assert "environment: unknown" in _explain(tmp_path, "text")
