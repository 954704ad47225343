"""Ray detached mode (seed 001): experience-maker actors and a trainer actor, joined by a buffer.

The only olingo package that imports ray. Modules:
    detached_trainer_base   `DetachedTrainer`, the abstract trainer actor (fit, buffer, sync)
    detached_trainer_ppo    `DetachedPPOTrainer`, PPO's learn phase as a Ray actor
    experience_maker_holder `ExperienceMakerHolder`, an actor making experience with its own models
    detached_replay_buffer  `DetachedReplayBuffer`, the trainer-side queue with backpressure
    weights                 strict weight sync (no silent key mismatches)
    launch                  starting Ray, spawning the actors, waiting, shutting down
    config                  the `ray:` config section (imports no ray: the PPO config embeds it)
The recipe that runs `olingo ppo` with `ray.enabled: true` is `olingo.recipes.ppo_ray`.
"""
