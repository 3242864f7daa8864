"""Domains: what one kind of generative model does inside the generic training lifecycle (`base.Domain`).
Built in: `diffusion` (image diffusion, `domains/diffusion/`); others are named by `package.module:ClassName`."""
