"""Training: the trainer's progress lines (Megatron-LM by default; other styles in
kubesim/waits.py), stalls, and free-form log lines.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from kubesim import waits
from kubesim.clock import rfc3339_nano
from kubesim.engine.pods import Pods
from kubesim.engine.state import Obj, PodState, RunState
from kubesim.gpus import HW_THERMAL, POWER_BRAKE, SW_THERMAL, GpuPlay
from kubesim.scenario import parse_duration

# Megatron-LM's training log line, with the wall-clock prefix recent Megatron versions print;
# fields: time, iteration, iterations, samples, ms, lr, batch, loss, grad_norm, rate, run.
MEGATRON_LINE = (
    " [{time}] iteration {iteration:>8}/{iterations:>8} | consumed samples: {samples:>12} | "
    "elapsed time per iteration (ms): {ms:.1f} | learning rate: {lr:.3E} | global batch size: {batch:>5} | "
    "lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {grad_norm:.3f} | number of skipped iterations:   0 | "
    "number of nan iterations:   0 |"
)


class Training(Pods):
    """The trainer in each run's containers."""

    def _training_up(self, r: RunState) -> bool:
        """Every pod doing the run's work is Running and Ready on a live node: collectives can complete."""
        pods = [p for p in r.pods if not p.deleted and (p.gpus or p.role in ("head", "worker", "job"))]
        if not pods:
            return False
        for p in pods:
            node = self.nodes.get(p.node)
            if not p.ready or p.phase != "Running" or (node is not None and not node.alive):
                return False
        return True

    def _do_train(self, r: RunState, args: Obj) -> None:
        r.train_gen += 1
        gen = r.train_gen
        every = parse_duration(args.get("every", 10), "train.every")
        total = int(args.get("iterations", 250_000))
        loss0, floor = float(args.get("loss", 3.2)), float(args.get("minLoss", 1.8))
        batch = int(args.get("batchSize", 1024))
        ckpt = int(args.get("checkpointEvery", 500))
        lag = int(args.get("lagRanks", 0))
        which = str(args.get("pods", "workers" if lag else "head"))
        style = str(args.get("style", "megatron"))
        skip_ratio = float(args.get("skipRatio", 0.0))
        eval_every = int(args.get("evalEvery", 0))
        template = str(args.get("line", MEGATRON_LINE))
        jitter = float(args.get("jitter", 0.0))
        pause_every = int(args.get("pauseEvery", 0))
        pause_for = parse_duration(args.get("pauseFor", 0), "train.pauseFor")
        forge = str(args.get("forgeTime", ""))
        stamp_prefix = bool(args.get("stampPrefix", False))
        # Ranks in lockstep (data parallel): each prints a step once its own compute is done, and the
        # step ends when the slowest is (the others wait in the collective). `rankJitter`: each rank's
        # compute varies by up to this share; `straggler` (a pod index) is `slower` (0.2: 20 %) from
        # `slowFrom` after training starts, for `slowFor` of every `slowEvery` (intermittent; 0: for good).
        rank_jitter = float(args.get("rankJitter", 0.0))
        straggler = int(args.get("straggler", -1))
        slower = float(args.get("slower", 0.0))
        slow_from = parse_duration(args.get("slowFrom", 0), "train.slowFrom")
        slow_for = parse_duration(args.get("slowFor", 0), "train.slowFor")
        slow_every = parse_duration(args.get("slowEvery", 0), "train.slowEvery")
        # `hiccups`: the chance per rank and step that its compute takes 30–100 % longer once (a GC pause,
        # a page fault storm, a noisy neighbour): heavy-tailed noise that names no straggler
        hiccups = float(args.get("hiccups", 0.0))
        lockstep = rank_jitter > 0 or straggler >= 0 or hiccups > 0
        # `gpus`: play the pods' GPUs (kubesim/gpus.py) in lockstep; `throttleGpu` (an index on the
        # straggler's pod): the straggler's slowness is that GPU throttling (`throttleReason`: thermal,
        # power-brake)
        if args.get("gpus"):
            r.gpu_play = GpuPlay(self._rng, jitter=float(args.get("gpuJitter", 0.02)),
                                 sm_level=float(args.get("smActivity", 0.85)),
                                 throttle_index=int(args.get("throttleGpu", -1)),
                                 throttle_reason=POWER_BRAKE if args.get("throttleReason") == "power-brake"
                                 else HW_THERMAL | SW_THERMAL)
        began = self.elapsed
        if "startIteration" in args:
            r.iteration = int(args["startIteration"])
        r.every = every
        r.skip_ratio = skip_ratio
        r.print_which = which
        r.style = style
        r.forge = forge

        def own_time(pod: PodState) -> datetime:
            """The trainer's own clock as it prints it: its node's, or a forged one."""
            if forge == "9999":
                return datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
            t = self._node_time(pod.node)
            if forge:
                t += timedelta(seconds=parse_duration(forge.lstrip("+"), "train.forgeTime"))
            return t

        def slow_now() -> bool:
            since = self.elapsed - began - slow_from
            if straggler < 0 or slower <= 0 or since < 0:
                return False
            return not (slow_for > 0 and slow_every > 0) or since % slow_every < slow_for

        def note_slow(pod: PodState, on: bool) -> None:
            """The truth: when the straggler's stretches of slowness began and ended."""
            r.straggler_pod = pod.ref.name
            open_ = bool(r.straggling) and r.straggling[-1][1] is None
            if on and not open_:
                r.straggling.append([self.elapsed, None])
            elif not on and open_:
                r.straggling[-1][1] = self.elapsed

        def tick() -> None:
            if gen != r.train_gen or r.finished:
                return
            delay = every * (self._rng.uniform(1 - jitter, 1 + jitter) if jitter else 1.0)
            targets = [p for p in self._pods(r, which) if p.ready]
            computes: dict[str, float] = {}
            if lockstep and targets:
                slow = slow_now()
                for pod in targets:
                    c = delay * (self._rng.uniform(1 - rank_jitter, 1 + rank_jitter) if rank_jitter else 1.0)
                    if hiccups and self._rng.random() < hiccups:
                        c *= 1 + self._rng.uniform(0.3, 1.0)
                    if pod.index == straggler:
                        note_slow(pod, slow)
                        if slow:
                            c *= 1 + slower
                    computes[pod.ref.name] = c
                delay = max(computes.values())
                play = r.gpu_play
                if play is not None:
                    if play.throttle_index >= 0 and not play.throttle_pod:
                        play.throttle_pod = next((p.ref.name for p in targets if p.index == straggler), "")
                    play.step([(p.ref.name, p.node, p.gpus, computes[p.ref.name]) for p in targets], delay,
                              slow, slower)
            if targets and self.elapsed >= r.blocked_until and self._training_up(r):
                r.iteration += 1
                it = r.iteration
                loss = floor + (loss0 - floor) * math.exp(-it / 4000.0) + self._rng.uniform(-0.02, 0.02)
                ms = delay * 1000 * self._rng.uniform(0.99, 1.01)
                lr = min(3e-4, 3e-4 * it / 2000)
                grad_norm = self._rng.uniform(0.2, 0.4)
                skipped = skip_ratio > 0 and math.floor(it * skip_ratio) > math.floor((it - 1) * skip_ratio)
                r.skipped += int(skipped)
                if not skipped and it > r.hwm:  # the truth: a valid update past the high-water mark
                    r.hwm = it
                    r.last_advance = self.elapsed
                resumed, r.resume_note = r.resume_note, 0
                for pod in targets:
                    rank_it = it - lag * pod.index if lag else it
                    if rank_it < 1:
                        continue
                    t = own_time(pod)
                    fields = {
                        "time": t.strftime("%Y-%m-%d %H:%M:%S"),
                        "now": t,
                        "iteration": rank_it,
                        "iterations": total,
                        "samples": rank_it * batch,
                        "ms": ms,
                        "lr": lr,
                        "batch": batch,
                        "loss": loss,
                        "grad_norm": grad_norm,
                        "rate": batch * 1000 / ms,
                        "run": r.spec.name,
                    }
                    lines = waits.progress_lines(self, style, template, fields, skipped, r.skipped, eval_every)
                    if resumed:
                        path = f"/mnt/checkpoints/{r.spec.name}"
                        lines = [*waits.resume_lines(style, path, resumed, t), *lines]
                    saving = (ckpt and rank_it % ckpt == 0) or (pause_every and it % pause_every == 0)
                    if saving and style == "megatron":
                        lines += [
                            f"saving checkpoint at iteration {rank_it:>8} to /mnt/checkpoints/{r.spec.name}",
                            f"  successfully saved checkpoint at iteration {rank_it:>8} to "
                            f"/mnt/checkpoints/{r.spec.name}",
                        ]
                    if stamp_prefix:
                        lines = [f"{rfc3339_nano(t)} {line}" for line in lines]
                    if lag:
                        lines = [f"[rank{pod.index}]:{line}" for line in lines]
                    if computes:
                        # printed once this rank's own compute is done, within the step
                        self._after(computes[pod.ref.name], self._printer(pod, lines))
                    else:
                        self._logs(pod, lines)
                    pod.log_max = max(pod.log_max, it)
                if pause_every and it % pause_every == 0:
                    delay += pause_for  # a checkpoint save or an evaluation holds the next step back
            if r.iteration < total:
                self._after(delay, tick)

        tick()

    def _printer(self, pod: PodState, lines: list[str]) -> Callable[[], None]:
        return lambda: self._logs(pod, lines)

    def _do_stall(self, r: RunState, args: Obj) -> None:
        r.train_gen += 1

    def _do_pause(self, r: RunState, args: Obj) -> None:
        """No step for a while (a long checkpoint save, an evaluation pass); then training goes on."""
        r.blocked_until = max(r.blocked_until, self.elapsed + parse_duration(args.get("for", 60), "pause.for"))

    def _do_log(self, r: RunState, args: Obj) -> None:
        for pod in self._pods(r, str(args.get("pods", "head"))):
            self._logs(pod, [str(x) for x in args["lines"]])
