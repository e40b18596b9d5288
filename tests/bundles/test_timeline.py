"""The bundle's index.html in headless Chromium (Debian `chromium`): charts render, no network, no console errors."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from collector.capture import bundle_from_dump
from collector.settings import Settings
from exporters.bundles.model import GpuSample
from exporters.bundles.writer import write_bundle
from tests.bundles.scenario import NOW, RUN, write_scenario

# As /work/.library/env/machines/python.md: without the background-networking flags Chromium
# reaches out at start; the resolver and proxy rules make any fetch the page tried fail loudly.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
         "--enable-logging=stderr", "--v=0"]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)",
                    pytrace=False)
    return exe


def open_page(page: Path, tmp: Path) -> tuple[str, list[str]]:
    """(the DOM after scripts ran, console lines Chromium logged)."""
    res = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=3000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr[-2000:]
    console = [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln]
    return res.stdout, console


def screenshot(page: Path, out: Path, tmp: Path) -> None:
    res = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={tmp / 'profile-shot'}", "--window-size=1200,1800",
                          f"--screenshot={out}", page.as_uri()], capture_output=True, text=True, timeout=90)
    assert res.returncode == 0 and out.is_file() and out.stat().st_size > 10_000, res.stderr[-2000:]


def selfcheck(dom: str) -> dict[str, str]:
    m = re.search(r'<div id="selfcheck"([^>]*)>', dom)
    assert m, "the page's self-check did not run"
    return dict(re.findall(r'data-([a-z]+)="([^"]*)"', m.group(1)))


def test_detector_sees_console_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom'); notDefined();</script></body></html>")
    _, console = open_page(bad, tmp_path)
    assert any("Uncaught ReferenceError" in ln for ln in console), console


def test_timeline_page_renders_offline(tmp_path: Path) -> None:
    dump = write_scenario(tmp_path / "dump")
    inp = bundle_from_dump(dump, RUN, Settings(), at=NOW, artifacts_dir=tmp_path / "artifacts")
    # With GPU series (as a node agent would report them): utilization stays up, power falls at the hang.
    gpu = tuple(GpuSample(NOW - timedelta(minutes=m), f"gpu-node-{n}", str(g), 99.0 if m < 10 else 97.0,
                          70.0 if m < 10 else 380.0, "agent")
                for m in range(0, 60, 2) for n in range(2) for g in range(2))
    from dataclasses import replace

    b = tmp_path / "bundle"
    write_bundle(replace(inp, gpu=gpu), b)
    dom, console = open_page(b / "index.html", tmp_path)
    check = selfcheck(dom)
    assert check["status"] == "ok", check
    assert check["charts"] == "5" and check["drawn"] == "5" and check["fetched"] == "0"
    assert console == [], console
    assert "ranks diverge at collective #1580" in dom and "STALLED" in dom
    assert dom.count('data-mark="claim"') >= 3 and 'data-mark="event"' in dom
    screenshot(b / "index.html", tmp_path / "timeline.png", tmp_path)  # kept as the test's artifact

    # Without an agent: the GPU section says so, the other charts still render.
    b2 = tmp_path / "bundle-no-gpu"
    write_bundle(inp, b2)
    dom2, console2 = open_page(b2 / "index.html", tmp_path)
    check2 = selfcheck(dom2)
    assert check2["status"] == "ok" and check2["charts"] == "3" and console2 == []
    assert "missing: no agent" in dom2
