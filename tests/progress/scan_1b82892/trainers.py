"""Stateless parsers for the progress lines of common trainers.

Each parser takes one line (or one carriage-return frame of a progress bar) with any kubelet
timestamp and rank prefix already removed, and returns what the line says, or None. Continuity
(deduplication, derived steps, epoch offsets) is the scanner's job. Every integer is bounded
(`numbers`): a line with one past its bound raises numbers.OutOfRange and yields nothing.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import re2

from collector.progress.numbers import COUNT_MAX, OutOfRange, bounded

# google-re2 ships no type information; its compiled pattern mirrors re.Pattern's search/groupindex.
CustomRegex = Any
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # errors are raised (and reported with the pattern), not printed

# --- Megatron-LM / Megatron-DeepSpeed --------------------------------------------------------
# " iteration      122/  250000 | consumed samples: ... | lm loss: 2.504220E+00 | ...
#   | number of skipped iterations:   0 | number of nan iterations:   0 |"
# Validation lines ("validation loss at iteration 1000 | lm loss value: ...") have no "N/ M |"; NeMo's
# "Validation: iteration 5/10" has no "|" either, and an evaluation/test/sanity label before the
# iteration is refused outright.
_MEGATRON = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")  # literal start: sre's fast prefix scan
_NOT_TRAINING = ("alidation", "valuat", "esting", "anity")
_MEG_SKIPPED = re.compile(r"number of skipped iterations:\s*(\d+)")
_MEG_NAN = re.compile(r"number of nan iterations:\s*(\d+)")


class MegatronLine(NamedTuple):
    step: int
    total: int
    loss: float | None
    skipped: bool  # every iteration of the interval was skipped
    skipped_count: int  # iterations of the interval skipped (fp16 overflow)


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _count(rx: re.Pattern[str], s: str, what: str) -> int:
    m = rx.search(s)
    return bounded(m.group(1), COUNT_MAX, what) if m else 0


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
    head = s[max(0, m.start() - 64) : m.start()]
    if "alidation" in head or "valuat" in head or "esting" in head or "anity" in head:  # _NOT_TRAINING
        return None
    step = bounded(m.group(1), COUNT_MAX, "iteration")
    total = bounded(m.group(2), COUNT_MAX, "total iterations")
    loss = _megatron_loss(s, m.end() - 1)
    # Megatron prints a loss only when its interval average is > 0: a missing loss means every
    # iteration of the interval was skipped (fp16 overflow), or the average was NaN.
    all_skipped = False
    skipped = _count(_MEG_SKIPPED, s, "skipped iterations")
    if loss is None:
        all_skipped = skipped > 0
        if _count(_MEG_NAN, s, "nan iterations") > 0:
            loss = float("nan")
    return MegatronLine(step, total, loss, all_skipped, skipped)


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
        return DeepSpeedStep(
            bounded(m.group(1), COUNT_MAX, "step"),
            bounded(m.group(2), COUNT_MAX, "skipped steps"),
            _num(lo.group(1)) if lo else None,
        )
    g = _DS_GLOBAL.search(s)
    if g:
        return DeepSpeedStep(bounded(g.group(1), COUNT_MAX, "global step"), None, None)
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
    return HfDict(_num(m.group(1).strip("'\"")), bounded(st.group(1), COUNT_MAX, "step") if st else None)


# --- tqdm progress bars (Lightning and the HF Trainer) -----------------------------------------
# Lightning: "Epoch 0:  22%|███▏      | 4/18 [00:17<01:02,  4.47s/it, loss=10.072, v_num=193315]"
# HF Trainer: " 22%|██▏       | 40/180 [00:17<01:02,  2.3it/s]" (no description)
# Any other description (Validation DataLoader 0, Validating, Sanity Checking, Map, ...) is not
# training progress. A frame cut short ("6/18 [00:23<00:47,  3") still shows its step. A bar may sit
# behind a launcher prefix (Ray's "(RayTrainWorker pid=12, ip=10.0.0.3) ", pdsh's "worker-0: ") and
# be followed by other text on the same frame (a print without a newline): `Bar.end` says where the
# bar ends.
# All anchored (match at a known position) or literal-led: linear on any input.
_BAR_TAIL = re.compile(r"\|\s*(\d+)/(\d+|\?)\s*\[([^\]]{0,200})\]?")  # from the bar's closing `|`
_LIGHTNING_NOPCT = re.compile(r"^\s*Epoch (\d+):\s*(\d+)/(\d+|\?)\s*\[([^\]]{0,200})\]?")
# "Epoch 3:" (Lightning); NeMo's MegatronProgressBar puts its own ": " after tqdm's: "Epoch 0: :"
_EPOCH_DESC = re.compile(r"Epoch (\d+)(?::(?: :)?)?")
# Ray's worker prefix, or a host name (with a digit or `-`) then `:` (pdsh, as DeepSpeed's launcher)
_LAUNCHER_PREFIX = re.compile(r"^(?:\([A-Za-z_]\w{0,63} pid=\d+[^)]{0,100}\)\s*|([\w.-]{1,100}):\s)")
# A logging prefix: "2023-06-14 22:33:06,424 - INFO: ", "INFO:root:", absl's "I0614 22:33:06.424 12 x.py:8] "
_LOGGER_PREFIX = re.compile(
    r"^[^%|]{0,80}?\b(?:INFO|WARNING|WARN|DEBUG|ERROR)\b(?::[\w.]{1,60}:|[:\]]|\s-)?\s*"
    r"|^[IWEF]\d{4} [\d:.]{8,15}\s+\d+ [\w.-]{1,60}:\d+\]\s*"
)
# loss=, train_loss=, loss_step=, and NeMo's reduced_train_loss=
_BAR_LOSS = re.compile(r"(?<![\w.])(?:reduced_)?(?:train_)?loss(?:_step)?=\s*([^\s,\]]+)")


class Bar(NamedTuple):
    lightning: bool
    epoch: int | None
    n: int
    total: int | None
    loss: float | None
    end: int = 0  # where the bar's text ends in the frame


def _bar_desc(desc: str) -> tuple[bool, int | None] | None:
    """(lightning, epoch) for a training bar's description, None for any other bar."""
    p = _LAUNCHER_PREFIX.match(desc)
    if p and (p.group(1) is None or any(c.isdigit() or c == "-" for c in p.group(1))):
        desc = desc[p.end() :]
    g = _LOGGER_PREFIX.match(desc)
    if g:
        desc = desc[g.end() :]
    desc = desc.strip()
    if not desc:
        return False, None
    e = _EPOCH_DESC.fullmatch(desc)
    if e:
        return True, bounded(e.group(1), COUNT_MAX, "epoch")
    return None


def _bar_total(text: str) -> int | None:
    return bounded(text, COUNT_MAX, "bar total") if text != "?" else None


def parse_bar(frame: str) -> Bar | None:
    j = frame.find("%|")
    if j == -1:
        m = _LIGHTNING_NOPCT.match(frame)
        if m is None:
            return None
        lo = _BAR_LOSS.search(m.group(4))
        at_epoch = bounded(m.group(1), COUNT_MAX, "epoch")
        at_n = bounded(m.group(2), COUNT_MAX, "bar position")
        return Bar(True, at_epoch, at_n, _bar_total(m.group(3)), _num(lo.group(1)) if lo else None, m.end())
    i = j
    while i > 0 and i > j - 3 and frame[i - 1].isdigit():  # tqdm's percentage: 1 to 3 digits
        i -= 1
    k = frame.find("|", j + 2)
    if i == j or k == -1 or k - j > 400:
        return None
    kind = _bar_desc(frame[:i])
    if kind is None:
        return None
    t = _BAR_TAIL.match(frame, k)
    if t is None:
        return None
    lightning, epoch = kind
    n = bounded(t.group(1), COUNT_MAX, "bar position")
    total = _bar_total(t.group(2))
    if lightning:
        lo = _BAR_LOSS.search(t.group(3))
        return Bar(True, epoch, n, total, _num(lo.group(1)) if lo else None, t.end())
    if total is None:
        return None
    return Bar(False, None, n, total, None, t.end())


# --- torchtitan -------------------------------------------------------------------------------
# "[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384  memory: 49.66GiB(52.28%)
#  tps: 5,856  tflops: 339.16  mfu: 34.29%" (newer: "grad_norm:" after the loss), each field in its
# own ANSI colour unless colour printing is off; the scanner strips the colours and `[rankN]:`.
# Validation prints "validate step:"; with pipeline parallelism the ranks without the last stage
# print "loss: -1.0000", a placeholder, not a loss.
_TITAN = re.compile(r"\bstep:\s{0,16}(\d+)\s{1,16}loss:\s{0,16}(\S+)")


class StepLine(NamedTuple):
    step: int | None  # None: the line shows activity whose step it cannot place (see parse_nemo)
    loss: float | None
    total: int | None = None
    tps: float | None = None  # tokens per second per GPU, where the trainer prints it


# Tokens per second per GPU as torchtitan ("tps: 5,856", per device) and NeMo Automodel
# ("tps 11278.56(1409.82/gpu)": the run's, then per GPU) print them. Bounded: a tenant's number.
_TITAN_TPS = re.compile(r"\btps:\s{0,16}(\d{1,3}(?:,\d{3}){0,4}(?:\.\d{1,6})?|\d{1,15}(?:\.\d{1,6})?)\b")
_AUTOMODEL_TPS = re.compile(r"\| tps [\d.]{1,24}\((\d{1,15}(?:\.\d{1,6})?)/gpu\)")
MAX_TPS = 1e9  # tokens per second per GPU: far above any device


def _tps(m: re.Match[str] | None) -> float | None:
    if m is None:
        return None
    v = _num(m.group(1).replace(",", ""))
    return v if v is not None and 0.0 < v <= MAX_TPS else None


def parse_torchtitan(s: str) -> StepLine | None:
    m = _TITAN.search(s)
    if m is None or "memory:" not in s[m.end() :] or s.endswith("validate ", 0, m.start()):
        return None
    loss = _num(m.group(2))
    return StepLine(bounded(m.group(1), COUNT_MAX, "step"), None if loss == -1.0 else loss,
                    tps=_tps(_TITAN_TPS.search(s, m.end())))


# --- NeMo 2 (Lightning) ProgressPrinter ----------------------------------------------------------
# "Training epoch 0, iteration 120/149 | lr: 3e-05 | consumed_samples: 121 | global_batch_size: 1 |
#  global_step: 120 | reduced_train_loss: 1.233 | train_step_timing in s: 0.03146 | val_loss: 4.106"
# `iteration` counts within the epoch; `global_step` is the trainer's step. Validation prints
# "Validation: iteration 5/10" (no "Training epoch"), which is never a sample. NeMo's tqdm bar
# (MegatronProgressBar) is a Lightning bar: parse_bar.
_NEMO = re.compile(r"Training epoch (\d+), iteration (\d+)/(\d+)")
_NEMO_STEP = re.compile(r"\| global_step: (\d+)")
_NEMO_LOSS = re.compile(r"\| reduced_train_loss: ([^\s|]+)")


def parse_nemo(s: str) -> StepLine | None:
    m = _NEMO.search(s)
    if m is None:
        return None
    epoch = bounded(m.group(1), COUNT_MAX, "epoch")
    n = bounded(m.group(2), COUNT_MAX, "iteration")
    total = bounded(m.group(3), COUNT_MAX, "total iterations")
    g = _NEMO_STEP.search(s, m.end())
    lo = _NEMO_LOSS.search(s, m.end())
    loss = _num(lo.group(1)) if lo else None
    if g is not None:
        step: int | None = bounded(g.group(1), COUNT_MAX, "global step")
    else:
        # without global_step only the first epoch's iteration is the step (it restarts each epoch)
        step = n if epoch == 0 else None
    return StepLine(step, loss, total)


# --- NeMo Automodel ----------------------------------------------------------------------------
# "2026-08-10 15:55:20 | INFO | root | step 9 | epoch 0 | loss 0.6974 | grad_norm 1.5436 | lr 1.00e-05 |
#  mem 24.90 GiB | tps 11278.56(1409.82/gpu) | num_label_tokens 21541"; validation is
# "[val] step 9 | epoch 0 | loss ..." and is refused.
_AUTOMODEL = re.compile(r"\bstep (\d+) \| epoch (\d+) \| loss ([^\s|]+)")


def parse_automodel(s: str) -> StepLine | None:
    m = _AUTOMODEL.search(s)
    if m is None or s.rfind("[val", 0, m.start()) != -1:
        return None
    bounded(m.group(2), COUNT_MAX, "epoch")
    return StepLine(bounded(m.group(1), COUNT_MAX, "step"), _num(m.group(3)),
                    tps=_tps(_AUTOMODEL_TPS.search(s, m.end())))


# --- checkpoint resumes --------------------------------------------------------------------------
# The trainer's own word that it resumed, and from which step:
#   Megatron:   "  successfully loaded checkpoint from /ckpt [ t 0, p 0 ] at iteration 100"
#   torchtitan: "Loading the checkpoint at step 400."
#   HF Trainer: "  Continuing training from global step 200000"
#   torchelastic: "[default] Worker group FAILED. 3/3 attempts left; will restart worker group"
# Lightning's "Restoring states from the checkpoint path at ..." is left out: Lightning prints it
# for test/validate runs and its batch-size finder too, so it does not say that training resumed.
_MEG_LOADED = "successfully loaded checkpoint from "
_AT_ITERATION = re.compile(r" at iteration\s{1,16}(\d+)")
_TITAN_RESUME = re.compile(r"Loading the checkpoint at step (\d+)")
_HF_RESUME = re.compile(r"Continuing training from global step (\d+)")
# torchelastic's agent restarting its worker group in place (torchrun --max-restarts): the trainer
# starts over inside the same container, from its last checkpoint.
_ELASTIC_RESTART = "will restart worker group"


class Resume(NamedTuple):
    step: int | None
    format: str


def parse_resume(s: str) -> Resume | None:
    i = s.find(_MEG_LOADED)
    if i != -1:
        # the path is the tenant's: take the last " at iteration N" on the line
        j = s.rfind(" at iteration", i)
        m = _AT_ITERATION.match(s, j) if j != -1 else None
        return Resume(bounded(m.group(1), COUNT_MAX, "iteration") if m else None, "megatron")
    t = _TITAN_RESUME.search(s)
    if t:
        return Resume(bounded(t.group(1), COUNT_MAX, "step"), "torchtitan")
    h = _HF_RESUME.search(s)
    if h:
        return Resume(bounded(h.group(1), COUNT_MAX, "global step"), "hf-trainer")
    if _ELASTIC_RESTART in s and "Worker group FAILED" in s:
        return Resume(None, "torchelastic")
    return None


# --- user regex ------------------------------------------------------------------------------
# Tenants' lines meet the platform's (or a `scan` user's) pattern: it runs on RE2, which is linear in
# the line on any pattern, so no regex in a settings file can freeze the scanner.
def compile_custom(pattern: str) -> CustomRegex:
    """A user progress regex (RE2 syntax): named group `step` required, `loss` and `total` optional.

    Raises ValueError naming the problem: RE2 has no backreferences and no lookaround.
    """
    try:
        rx = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        hint = ""
        if any(t in pattern for t in ("(?=", "(?!", "(?<=", "(?<!")) or re.search(r"\\[1-9]|\(\?P=", pattern):
            hint = " (lookaround and backreferences are not supported: the regex must run in linear time)"
        raise ValueError(f"progress regex {pattern!r} does not compile (RE2 syntax): {why}{hint}") from e
    if "step" not in rx.groupindex:
        raise ValueError(f"progress regex {pattern!r} needs a named group 'step', e.g. (?P<step>\\d+)")
    return rx


class CustomLine(NamedTuple):
    step: int
    loss: float | None
    total: int | None


def parse_custom(rx: CustomRegex, s: str) -> CustomLine | None | str:
    """The match, None for no match, or a problem text when `step` is not an integer."""
    m = rx.search(s)
    if m is None:
        return None
    raw = m.group("step")
    try:
        step = bounded(raw.strip(), COUNT_MAX, "step") if isinstance(raw, str) else None
    except OutOfRange as e:
        if raw.strip().lstrip("+-").isdigit():
            return f"progress regex matched but {e}"
        step = None
    if step is None:
        shown = raw if not isinstance(raw, str) or len(raw) <= 40 else raw[:36] + "..."
        return f"progress regex matched but step {shown!r} is not an integer"
    groups = rx.groupindex
    loss = _num(m.group("loss")) if "loss" in groups and m.group("loss") is not None else None
    total = None
    if "total" in groups and m.group("total") is not None:
        raw_total = m.group("total").strip()
        try:
            total = bounded(raw_total, COUNT_MAX, "total")
        except OutOfRange as e:
            if raw_total.lstrip("+-").isdigit():
                return f"progress regex matched but {e}"
            total = None  # not a number: no total, as before
    return CustomLine(step, loss, total)
