"""`MakerPool`: the experience makers a `DetachedTrainer` drives, as the trainer sees them.

The trainer (olingo/ray/detached_trainer_base.py) holds one pool. The pool resolves the makers by
actor name, starts their working loops and watches them (a maker's exception fails the run with
the maker's traceback, a dead maker is waited for while Ray restarts it and handed the current
weights and its loop back), stops them at the end of `fit`, pushes weights through the object
store, and waits for every remote call at most `call_timeout_s`.

What the makers are handed (which weights, which policy version) stays the trainer's decision:
the pool calls back into it (`update`, `resync`, `restart`, `record`) where a maker needs weights
again or a loop has ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray
import torch
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

from olingo.ray.weights import state_dict_for_sync, state_dict_nbytes

logger = logging.getLogger("olingo.ray")


class MakerError(RuntimeError):
    """An experience maker failed; the message carries the maker's own traceback."""


class MakerPool:
    """The makers of one trainer: `names` (ColossalChat's `experience_maker_holder_name_list`),
    `handles` in the same order once `connect` has resolved them, `loops` (maker name -> ObjectRef
    of its running working loop) and `restarts`, the maker deaths survived so far.

    Args:
        names: the `ExperienceMakerHolder` actors' names.
        call_timeout_s: limit of every remote call (weight sync, stop, state, length queries).
        max_restarts: maker deaths survived before the run fails (Ray restarts the actor).
    """

    def __init__(self, names: list[str], call_timeout_s: float, max_restarts: int) -> None:
        self.names = list(names)
        self.handles: list[Any] = []
        self.loops: dict[str, Any] = {}
        self.restarts = 0
        self.call_timeout_s = call_timeout_s
        self.max_restarts = max_restarts

    def get(self, refs: list[Any], what: str) -> list[Any]:
        """`ray.get` with the call timeout; a maker's exception keeps its traceback."""
        try:
            return ray.get(refs, timeout=self.call_timeout_s)
        except GetTimeoutError:
            raise TimeoutError(f"{what}: no answer within call_timeout_s={self.call_timeout_s:.0f}s") from None
        except RayTaskError as err:
            raise MakerError(f"{what} failed in a maker; its traceback follows.\n{err}") from None

    # ---- connect, start, watch, restart, stop --------------------------------------------------
    def connect(self) -> None:
        """Resolve every maker by name and wait until each has started."""
        handles = []
        for name in self.names:
            try:
                handles.append(ray.get_actor(name))
            except ValueError:
                raise ValueError(
                    f"no experience maker actor named '{name}': "
                    "create the ExperienceMakerHolder actors (with .options(name=...)) before calling fit"
                ) from None
        self.handles = handles
        self.get([h.ready.remote() for h in handles], "waiting for the makers to start")

    def check_temperature(self, temperature: float, trainer: str) -> None:
        """Every maker must sample at the temperature the trainer (class name `trainer`) computes log-probs at."""
        settings = self.get([m.generation_settings.remote() for m in self.handles], "reading the makers' sampling settings")
        for name, got in zip(self.names, settings, strict=True):
            if abs(got["temperature_for_log_probs"] - temperature) > 1e-9:
                raise ValueError(
                    f"maker '{name}' samples at temperature {got['temperature_for_log_probs']} but the trainer computes "
                    f"log-probs at {temperature}: pass the makers' temperature to {trainer}(temperature=...)"
                )

    def update_each(self, makers: list[Any], update: Callable[[list[Any]], None], restart: Callable[[str], None]) -> None:
        """After a weight sync failed on a dead maker: `update([maker])` each of `makers` on its
        own; one that is still dead goes to `restart(name)` (which syncs it once Ray has it back)."""
        for maker in makers:
            try:
                update([maker])
            except RayActorError:
                restart(self.names[self.handles.index(maker)])

    def start_loops(self) -> None:
        """Start every maker's working loop (it pushes experience into the trainer's buffer)."""
        for name, maker in zip(self.names, self.handles, strict=True):
            self.loops[name] = maker.workingloop.remote()

    def check_loops(self, record: Callable[[str, Any], None], restart: Callable[[str], None]) -> None:
        """React to working loops that ended: a maker's exception raises `MakerError`, a dead
        maker is handed to `restart(name)`, and a loop that finished its own step budget gives
        its summary to `record(name, summary)` and is no longer watched."""
        refs = list(self.loops.values())
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        for name, ref in list(self.loops.items()):
            if ref not in done:
                continue
            try:
                summary = ray.get(ref, timeout=self.call_timeout_s)
            except RayActorError:
                restart(name)
                continue
            except RayTaskError as err:
                raise MakerError(f"experience maker '{name}' failed; its traceback follows.\n{err}") from None
            record(name, summary)
            del self.loops[name]

    def restart(self, name: str, resync: Callable[[Any], None]) -> None:
        """A dead maker: wait for Ray to restart it, `resync(handle)` it (give it weights) and,
        while its working loop is watched, start that loop again."""
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise RuntimeError(f"experience makers died {self.restarts} times (max_maker_restarts={self.max_restarts}); last: '{name}'")
        logger.warning("experience maker '%s' died; waiting for Ray to restart it (%d/%d)", name, self.restarts, self.max_restarts)
        maker = self.handles[self.names.index(name)]
        deadline = time.monotonic() + self.call_timeout_s
        while True:  # calls fail with ActorUnavailableError until Ray has brought the actor back
            try:
                self.get([maker.ready.remote()], f"restarting maker '{name}'")
                resync(maker)
                break
            except ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"experience maker '{name}' was not back within call_timeout_s={self.call_timeout_s:.0f}s") from None
                time.sleep(0.5)
            except RayActorError:
                raise RuntimeError(f"experience maker '{name}' died and was not restarted; create makers with .options(max_restarts=N)") from None
        if name in self.loops:
            self.loops[name] = maker.workingloop.remote()

    def stop(self) -> dict[str, Any]:
        """Tell every maker to stop and wait for the working loops: each loop's summary (or the
        error that ended it), by maker name. No loop is watched afterwards."""
        ended: dict[str, Any] = {}
        stops = [maker.stop.remote() for maker in self.handles]
        try:
            self.get(stops, "telling the makers to stop")
        except Exception:  # a dead maker cannot be told; its loop is accounted below
            logger.warning("could not reach every maker to stop it", exc_info=True)
        for name, ref in self.loops.items():
            try:
                ended[name] = ray.get(ref, timeout=self.call_timeout_s)
            except Exception as err:  # stopping must reach every maker
                ended[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
        self.loops = {}
        return ended

    # ---- state and weights -----------------------------------------------------------------
    def state_dicts(self) -> list[dict[str, Any]]:
        """Every maker's state (prompt position and what its making keeps), in `names` order."""
        return self.get([m.state_dict.remote() for m in self.handles], "reading the makers' state")

    def load_state_dicts(self, states: list[dict[str, Any]]) -> None:
        """Give each maker its state from a checkpoint; a checkpoint of another number of
        makers is ignored with a warning (the makers start fresh)."""
        if len(states) != len(self.handles):
            logger.warning("checkpoint holds %d makers' states, this run has %d makers: makers start fresh", len(states), len(self.handles))
            return
        self.get([m.load_state_dict.remote(s) for m, s in zip(self.handles, states, strict=True)], "restoring the makers' state")

    def push_weights(self, makers: list[Any], actor: torch.nn.Module, critic: torch.nn.Module | None, policy_version: int) -> dict[str, float]:
        """The actor's (and critic's) weights into the object store once; every maker in `makers`
        loads them (strict keys) and answers. Returns the `perf/weight_sync_*` metrics of the
        whole sync."""
        start = time.perf_counter()
        states = [state_dict_for_sync(actor), state_dict_for_sync(critic) if critic is not None else None]
        nbytes = sum(state_dict_nbytes(s) for s in states if s is not None)
        refs = [ray.put(s) if s is not None else None for s in states]
        calls = [m.update_experience_maker.remote(*refs, policy_version=policy_version, fully_update=True) for m in makers]
        answers = self.get(calls, "weight sync")
        seconds = time.perf_counter() - start
        tensors = sum(len(s) for s in states if s is not None)
        what = f"{len(states[0])} actor + {len(states[1])} critic tensors" if states[1] is not None else f"{len(states[0])} actor tensors"
        logger.info("[trainer] weight sync: %.3f MB (%s) to %d makers in %.2fs", nbytes / 1e6, what, len(makers), seconds)
        metrics = {
            "perf/weight_sync_s": seconds,
            "perf/weight_sync_gbps": nbytes * len(makers) / max(seconds, 1e-9) / 1e9,
            "perf/weight_sync_mb": nbytes / 1e6,
            "perf/weight_sync_tensors": float(tensors),
            # The names local training uses: the whole sync, makers' engine loads included.
            "time/weight_sync": seconds,
            "perf/weight_sync_GBps": nbytes * len(makers) / max(seconds, 1e-9) / 1e9,
        }
        engine_loads = [a["time/weight_sync"] for a in answers if isinstance(a, dict) and "time/weight_sync" in a]
        if engine_loads:  # makers with a vLLM engine streamed the weights on into it
            metrics["time/engine_weight_load"] = max(engine_loads)
        return metrics
