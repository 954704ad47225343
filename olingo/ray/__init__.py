"""Ray detached mode: experience-maker actors and a trainer actor, joined by a buffer.

The only olingo package that imports ray. Modules:
    detached_trainer_base   `DetachedTrainer`, the abstract trainer actor (fit, buffer, sync)
    detached_trainer_ppo    `DetachedPPOTrainer`, PPO's learn phase as a Ray actor
    detached_trainer_grpo   `DetachedGRPOTrainer`, the GRPO family's learn phase (no critic)
    experience_maker_holder `ExperienceMakerHolder`, an actor making experience with its own models
    making                  what a holder makes: PPO experience, or whole groups (GRPO family)
    detached_replay_buffer  `DetachedReplayBuffer`, the trainer-side queue with backpressure
    maker_pool              `MakerPool`, the trainer's makers: connect, watch, restart, stop, push weights
    weights                 strict weight sync (no silent key mismatches)
    launch                  starting Ray, spawning the actors, waiting, shutting down
    config                  the `ray:` config section (imports no ray: the PPO and GRPO configs embed it)
The recipes that run `olingo ppo` / `olingo grpo` with `ray.enabled: true` are
`olingo.recipes.ppo_ray` and `olingo.recipes.grpo_ray`.
"""
