"""Stateless parsers for the progress lines of common trainers.

Each parser takes one line (or one carriage-return frame of a progress bar) with any kubelet
timestamp and rank prefix already removed, and returns what the line says, or None. Continuity
(deduplication, derived steps, epoch offsets) is the scanner's job.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# --- Megatron-LM / Megatron-DeepSpeed --------------------------------------------------------
# " iteration      122/  250000 | consumed samples: ... | lm loss: 2.504220E+00 | ...
#   | number of skipped iterations:   0 | number of nan iterations:   0 |"
# Validation lines ("validation loss at iteration 1000 | lm loss value: ...") have no "N/ M |".
_MEGATRON = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")  # literal start: sre's fast prefix scan
_MEG_SKIPPED = re.compile(r"number of skipped iterations:\s*(\d+)")
_MEG_NAN = re.compile(r"number of nan iterations:\s*(\d+)")


class MegatronLine(NamedTuple):
    step: int
    total: int
    loss: float | None
    skipped: bool


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _count(rx: re.Pattern[str], s: str) -> int:
    m = rx.search(s)
    return int(m.group(1)) if m else 0


def _megatron_loss(s: str, pos: int) -> float | None:
    # "| lm loss: 2.504220E+00 |" (some forks: "| loss: ..."); not "loss scale:", not "moe_loss:"
    j = s.find("loss:", pos)
    while j != -1:
        key_start = s.rfind("|", pos, j)
        if key_start != -1 and s[key_start + 1 : j].strip() in ("", "lm"):
            end = s.find("|", j)
            return _num(s[j + 5 : end if end != -1 else len(s)].strip())
        j = s.find("loss:", j + 5)
    return None


def parse_megatron(s: str) -> MegatronLine | None:
    m = _MEGATRON.search(s)
    if m is None:
        return None
    loss = _megatron_loss(s, m.end() - 1)
    # Megatron prints a loss only when its interval average is > 0: a missing loss means every
    # iteration of the interval was skipped (fp16 overflow), or the average was NaN.
    all_skipped = False
    if loss is None:
        all_skipped = _count(_MEG_SKIPPED, s) > 0
        if _count(_MEG_NAN, s) > 0:
            loss = float("nan")
    return MegatronLine(int(m.group(1)), int(m.group(2)), loss, all_skipped)


# --- DeepSpeed -------------------------------------------------------------------------------
# "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768"
# (ZeRO-3 prints "Overflow detected. Skipping step."). These carry no step number.
def is_deepspeed_overflow(s: str) -> bool:
    return "kipping step" in s and ("OVERFLOW! Rank" in s or "Overflow detected. Skipping step" in s)


# steps_per_print: "[Rank 0] step=100, skipped=2, lr=[0.0001], mom=[(0.9, 0.999)]"
# throughput timer: "epoch=0/micro_step=200/global_step=100, RunningAvgSamplesPerSec=..."
_DS_STEP = re.compile(r"(?<![\w/])step=(\d+), skipped=(\d+)")
_DS_GLOBAL = re.compile(r"/global_step=(\d+), RunningAvgSamplesPerSec")
_DS_LOSS = re.compile(r"\bloss=([^\s,\]]+)")


class DeepSpeedStep(NamedTuple):
    step: int
    skipped_total: int | None  # cumulative skipped steps, when the line says
    loss: float | None


def parse_deepspeed_step(s: str) -> DeepSpeedStep | None:
    m = _DS_STEP.search(s)
    if m:
        lo = _DS_LOSS.search(s)
        return DeepSpeedStep(int(m.group(1)), int(m.group(2)), _num(lo.group(1)) if lo else None)
    g = _DS_GLOBAL.search(s)
    if g:
        return DeepSpeedStep(int(g.group(1)), None, None)
    return None


# --- Hugging Face Trainer --------------------------------------------------------------------
# "{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}" — training dicts start
# with 'loss'; eval ({'eval_loss': ...}) and the final summary ({'train_runtime': ...}) do not.
_HF_DICT = re.compile(r"""\{\s*['"]loss['"]:\s*([^,}\s]+)""")
_HF_STEP = re.compile(r"""['"](?:global_)?step['"]:\s*(\d+)""")


class HfDict(NamedTuple):
    loss: float | None
    step: int | None  # only when the dict carries one (most Trainer versions do not)


def parse_hf_dict(s: str) -> HfDict | None:
    m = _HF_DICT.search(s)
    if m is None:
        return None
    st = _HF_STEP.search(s, m.end())
    return HfDict(_num(m.group(1).strip("'\"")), int(st.group(1)) if st else None)


# --- tqdm progress bars (Lightning and the HF Trainer) -----------------------------------------
# Lightning: "Epoch 0:  22%|███▏      | 4/18 [00:17<01:02,  4.47s/it, loss=10.072, v_num=193315]"
# HF Trainer: " 22%|██▏       | 40/180 [00:17<01:02,  2.3it/s]" (no description)
# Any other description (Validation DataLoader 0, Validating, Sanity Checking, Map, ...) is not
# training progress. A frame cut short ("6/18 [00:23<00:47,  3") still shows its step.
_LIGHTNING = re.compile(r"^\s*Epoch (\d+):\s*(?:\d+%\|[^|]*\|)?\s*(\d+)/(\d+|\?)\s*\[([^\]]*)")
_HF_BAR = re.compile(r"^\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)\s*\[")
_BAR_LOSS = re.compile(r"(?<![\w.])(?:train_)?loss(?:_step)?=\s*([^\s,\]]+)")


class Bar(NamedTuple):
    lightning: bool
    epoch: int | None
    n: int
    total: int | None
    loss: float | None


def parse_bar(frame: str) -> Bar | None:
    m = _LIGHTNING.match(frame)
    if m:
        lo = _BAR_LOSS.search(m.group(4))
        total = int(m.group(3)) if m.group(3) != "?" else None
        return Bar(True, int(m.group(1)), int(m.group(2)), total, _num(lo.group(1)) if lo else None)
    h = _HF_BAR.match(frame)
    if h:
        return Bar(False, None, int(h.group(1)), int(h.group(2)), None)
    return None


# --- user regex ------------------------------------------------------------------------------
def compile_custom(pattern: str) -> re.Pattern[str]:
    """A user progress regex: named group `step` required, `loss` and `total` optional."""
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"progress regex does not compile: {e}") from e
    if "step" not in rx.groupindex:
        raise ValueError("progress regex needs a named group 'step', e.g. (?P<step>\\d+)")
    return rx


class CustomLine(NamedTuple):
    step: int
    loss: float | None
    total: int | None


def parse_custom(rx: re.Pattern[str], s: str) -> CustomLine | None | str:
    """The match, None for no match, or a problem text when `step` is not an integer."""
    m = rx.search(s)
    if m is None:
        return None
    raw = m.group("step")
    try:
        step = int(raw)
    except (TypeError, ValueError):
        return f"progress regex matched but step {raw!r} is not an integer"
    groups = rx.groupindex
    loss = _num(m.group("loss")) if "loss" in groups and m.group("loss") is not None else None
    total = None
    if "total" in groups and m.group("total") is not None:
        try:
            total = int(m.group("total"))
        except ValueError:
            total = None
    return CustomLine(step, loss, total)
