"""Image diffusion: the families of `unirl_core.models.families`, latent-trajectory rollouts (`unirl_core.domains.diffusion.rollout`),
the algorithms of `unirl_core.algorithms`, images for the rewards (`domain.DiffusionDomain`)."""
