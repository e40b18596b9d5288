"""The Dockerfile, parsed (no Docker engine here): multi-stage, non-root, small, and no Ray."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]


def stages() -> dict[str, list[dict[str, Any]]]:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    out: dict[str, list[dict[str, Any]]] = {}
    current = ""
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            current = ins["value"].split(" AS ")[-1].strip() if " AS " in ins["value"] else ins["value"]
            out[current] = []
        if current:
            out[current].append(ins)
    return out


def test_multi_stage_with_collector_and_agent_targets() -> None:
    s = stages()
    assert list(s) == ["build", "runtime", "collector", "agent"]
    # The final images start from the runtime stage, which copies only the venv out of the build.
    assert s["collector"][0]["value"] == "runtime AS collector" and s["agent"][0]["value"] == "runtime AS agent"
    copies = [i["value"] for i in s["runtime"] if i["instruction"] == "COPY"]
    assert copies == ["--from=build /opt/taugrid /opt/taugrid"]
    assert not any(i["instruction"] == "RUN" and re.search(r"\b(gcc|build-essential|apt-get install)\b", i["value"])
                   for i in s["runtime"])


def test_every_target_runs_as_a_non_root_user() -> None:
    for target in ("collector", "agent"):
        users = [i["value"] for i in stages()[target] if i["instruction"] == "USER"]
        assert users, f"{target}: no USER"
        uid = users[-1].split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{target}: USER {users[-1]}"  # numeric: runAsNonRoot can check


def test_no_ray_in_any_image() -> None:
    text = (ROOT / "Dockerfile").read_text()
    installs = [i["value"] for i in DockerfileParser(path=str(ROOT / "Dockerfile")).structure
                if i["instruction"] == "RUN" and "pip install" in i["value"]]
    assert installs and all(re.search(r"pip install (--\S+ )*\.(\s|$)", cmd) for cmd in installs)  # no extras
    assert not re.search(r"\bray\b", text.split("\n# ---", 1)[1], re.IGNORECASE)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if re.match(r"ray\b", d, re.IGNORECASE)], "ray is a runtime dependency"


def test_entrypoints_match_the_chart() -> None:
    for target, cmd in (("collector", "controller"), ("agent", "agent")):
        ins = {i["instruction"]: i["value"] for i in stages()[target]}
        assert ins["ENTRYPOINT"] == '["taugrid-evidence"]'
        assert ins["CMD"].startswith(f'["{cmd}"')
    chart = (ROOT / "charts" / "taugrid-evidence" / "templates" / "daemonset.yaml").read_text()
    assert "- taugrid-evidence\n            - agent" in chart


def test_build_context_is_what_the_copies_need() -> None:
    sources = [src for i in DockerfileParser(path=str(ROOT / "Dockerfile")).structure
               if i["instruction"] == "COPY" and not i["value"].startswith("--from")
               for src in i["value"].split()[:-1]]
    assert sources == ["pyproject.toml", "README.md", "collector", "exporters"]
    for src in sources:
        assert (ROOT / src).exists(), src
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[0] == "*" and {"!pyproject.toml", "!README.md", "!collector/", "!exporters/"} <= set(ignore)
