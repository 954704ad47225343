"""The `ray:` section of `olingo ppo` and `olingo grpo`: detached mode's own typed config.

Pure configuration, importable without ray installed (the PPO and GRPO configs embed it); the modules
that import ray are the others of this package.
"""

from __future__ import annotations

from pydantic import Field

from olingo.config import StrictModel


class ActorResources(StrictModel):
    """Ray resources of one actor."""

    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved for the actor (also its torch threads)")
    num_gpus: float = Field(0.0, ge=0, description="GPUs reserved for the actor (fractions share a GPU)")


class RayConfig(StrictModel):
    """Detached mode: experience makers and the trainer as separate Ray actors (olingo.ray)."""

    enabled: bool = Field(False, description="run the trainer and the experience makers as Ray actors instead of one process")
    address: str | None = Field(None, description="Ray cluster to join (default: $RAY_ADDRESS, else start a local instance)")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the local Ray instance started when none is joined (default: all)")
    num_makers: int = Field(1, ge=1, description="experience-maker actors, each with its own copies of the models it generates and scores with")
    maker_resources: ActorResources = Field(default_factory=ActorResources, description="resources of each maker")
    trainer_resources: ActorResources = Field(default_factory=ActorResources, description="resources of the trainer")
    buffer_limit: int = Field(0, ge=0, description="training batches the trainer's buffer holds before makers wait (0: one episode's worth)")
    max_staleness: int | None = Field(1, ge=0, description="drop experience made more than this many weight syncs ago (null: keep all)")
    max_restarts: int = Field(3, ge=0, description="times Ray restarts a dead maker (it then gets the current weights)")
    call_timeout_s: float = Field(300.0, gt=0, description="limit of every remote call")
    experience_timeout_s: float = Field(600.0, gt=0, description="longest wait for the next experience batch")
