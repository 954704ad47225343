"""Ray detached mode (seed 001): experience-maker actors and a trainer actor, joined by a buffer.

The only olingo package that imports ray. Modules:
    detached_trainer_base   `DetachedTrainer`, the abstract trainer actor (fit, buffer, sync)
    detached_trainer_ppo    `DetachedPPOTrainer`, PPO's learn phase as a Ray actor
    experience_maker_holder `ExperienceMakerHolder`, an actor making experience with its own models
    detached_replay_buffer  `DetachedReplayBuffer`, the trainer-side queue with backpressure
    weights                 strict weight sync (no silent key mismatches)
    launch                  `olingo ppo` with `ray.enabled: true`
"""

from olingo.errors import require

require("ray", "Ray detached mode (olingo.ray, ray.enabled=true)")
