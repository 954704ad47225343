"""Launching detached PPO or GRPO: start or join Ray, spawn the actors, wait, shut everything down.

Everything here that touches `ray` takes only the `ray:` config section (`RayConfig`) and the
actors' own constructor arguments; the recipes that read a whole config and decide those
arguments are `olingo.recipes.ppo_ray` and `olingo.recipes.grpo_ray`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import ray

from olingo.config import ConfigError
from olingo.ray.config import RayConfig
from olingo.ray.detached_trainer_base import raise_if_interrupted  # noqa: F401 - the recipes' way in (they import ray lazily)
from olingo.ray.detached_trainer_grpo import DetachedGRPOTrainer
from olingo.ray.detached_trainer_ppo import DetachedPPOTrainer
from olingo.ray.experience_maker_holder import ExperienceMakerHolder

logger = logging.getLogger("olingo.ray")


def start_ray(rc: RayConfig) -> bool:
    """Join `rc.address` / $RAY_ADDRESS, or start a local instance; True when started here."""
    if ray.is_initialized():
        return False
    address = rc.address or os.environ.get("RAY_ADDRESS")
    if address:
        try:
            ray.init(address=address, log_to_driver=True)
        except ConnectionError as err:
            raise ConnectionError(
                f"could not join the Ray cluster at {address}: {err}. A cluster from `ray start` uses token "
                "authentication (the default since Ray 2.59): set RAY_AUTH_MODE=token here too; the token is read "
                "from ~/.ray/auth_token or RAY_AUTH_TOKEN"
            ) from None
        logger.info("joined the Ray cluster at %s", address)
        return False
    ray.init(num_cpus=rc.num_cpus, include_dashboard=False, log_to_driver=True)
    logger.info("started a local Ray instance with %s CPUs", ray.cluster_resources().get("CPU"))
    return True


def check_resources(rc: RayConfig) -> None:
    """The makers and the trainer must fit in the cluster at once, or the trainer would wait
    for resources forever: say so before creating any actor."""
    total = ray.cluster_resources()
    for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
        need = rc.num_makers * getattr(rc.maker_resources, key) + getattr(rc.trainer_resources, key)
        if need > total.get(name, 0.0) + 1e-9:
            raise ConfigError(
                f"ray: {rc.num_makers} makers x {getattr(rc.maker_resources, key)} + trainer {getattr(rc.trainer_resources, key)} "
                f"= {need:g} {name}s, but the cluster has {total.get(name, 0.0):g}: lower ray.maker_resources/trainer_resources "
                "(fractions are allowed) or ray.num_makers"
            )


def spawn_maker(rc: RayConfig, name: str, *args: Any, **kwargs: Any) -> Any:
    """An `ExperienceMakerHolder` actor named `name` with the maker resources and restarts of `rc`."""
    return ExperienceMakerHolder.options(name=name, max_restarts=rc.max_restarts, **rc.maker_resources.model_dump()).remote(*args, **kwargs)


TRAINERS = {"ppo": DetachedPPOTrainer, "grpo": DetachedGRPOTrainer}


def spawn_trainer(rc: RayConfig, name: str, *args: Any, algorithm: str = "ppo", **kwargs: Any) -> Any:
    """The trainer actor of `algorithm` (`TRAINERS`: `DetachedPPOTrainer`, `DetachedGRPOTrainer`),
    answering once constructed (resources granted, models loaded)."""
    trainer = TRAINERS[algorithm].options(name=name, **rc.trainer_resources.model_dump()).remote(*args, **kwargs)
    ray.get(trainer.buffer_get_length.remote(), timeout=rc.call_timeout_s)
    return trainer


def call(rc: RayConfig, ref: Any) -> Any:
    """The result of one remote call, within `rc.call_timeout_s`."""
    return ray.get(ref, timeout=rc.call_timeout_s)


def wait_for(ref: Any, poll_s: float = 5.0, on_stop: Callable[[int], Any] | None = None) -> Any:
    """Wait for a long call (`fit`) in short polls, so Ctrl-C reaches this process. With
    `on_stop`, the first SIGINT/SIGTERM is handed to it (the trainer's `request_stop`) and the
    wait goes on until the trainer has checkpointed; a second one, or any without `on_stop`,
    raises at once and the caller removes the actors."""
    from olingo.trainer import interrupt

    if on_stop is not None:
        interrupt.arm("episode")
    forwarded = False
    try:
        while True:
            done, _ = ray.wait([ref], timeout=poll_s if on_stop is None else min(poll_s, 0.5))  # a stop goes out within 0.5 s
            if done:
                return ray.get(ref, timeout=poll_s)
            signum = interrupt.stop_requested() if on_stop is not None else None
            if signum is not None and not forwarded:
                forwarded = True
                on_stop(signum)
    finally:
        if on_stop is not None:
            interrupt.disarm()


def shut_down(actors: Sequence[Any], started_here: bool) -> None:
    """Remove every actor; stop Ray when this process started it."""
    for actor in actors:
        ray.kill(actor)
    if started_here:
        ray.shutdown()
