"""Image diffusion: the families of `unirl_core.models.families`, latent-trajectory rollouts (`unirl_core.rollout`),
the algorithms of `unirl_core.algorithms`, images for the rewards (`domain.DiffusionDomain`)."""
