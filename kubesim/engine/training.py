"""Training: the trainer's progress lines (Megatron-LM by default; other styles in
kubesim/waits.py), stalls, and free-form log lines.
"""

from __future__ import annotations

import math

from kubesim import waits
from kubesim.engine.pods import Pods
from kubesim.engine.state import Obj, RunState
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
        if "startIteration" in args:
            r.iteration = int(args["startIteration"])
        r.every = every
        r.skip_ratio = skip_ratio

        def tick() -> None:
            if gen != r.train_gen or r.finished:
                return
            targets = [p for p in self._pods(r, which) if p.ready]
            if targets:
                r.iteration += 1
                it = r.iteration
                loss = floor + (loss0 - floor) * math.exp(-it / 4000.0) + self._rng.uniform(-0.02, 0.02)
                ms = every * 1000 * self._rng.uniform(0.97, 1.03)
                lr = min(3e-4, 3e-4 * it / 2000)
                grad_norm = self._rng.uniform(0.2, 0.4)
                skipped = skip_ratio > 0 and math.floor(it * skip_ratio) > math.floor((it - 1) * skip_ratio)
                r.skipped += int(skipped)
                if not skipped and it > r.hwm:  # the truth: a valid update past the high-water mark
                    r.hwm = it
                    r.last_advance = self.elapsed
                for pod in targets:
                    rank_it = it - lag * pod.index if lag else it
                    if rank_it < 1:
                        continue
                    fields = {
                        "time": self.clock.now().strftime("%Y-%m-%d %H:%M:%S"),
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
                    if ckpt and rank_it % ckpt == 0 and style == "megatron":
                        lines += [
                            f"saving checkpoint at iteration {rank_it:>8} to /mnt/checkpoints/{r.spec.name}",
                            f"  successfully saved checkpoint at iteration {rank_it:>8} to "
                            f"/mnt/checkpoints/{r.spec.name}",
                        ]
                    if lag:
                        lines = [f"[rank{pod.index}]:{line}" for line in lines]
                    self._logs(pod, lines)
            if r.iteration < total:
                self._after(every, tick)

        tick()

    def _do_stall(self, r: RunState, args: Obj) -> None:
        r.train_gen += 1

    def _do_log(self, r: RunState, args: Obj) -> None:
        for pod in self._pods(r, str(args.get("pods", "head"))):
            self._logs(pod, [str(x) for x in args["lines"]])
