"""Parts a model family composes (mixed in beside `Family`, each overridable on its own):

| part                     | module        | what it does                                                          |
|--------------------------|---------------|-----------------------------------------------------------------------|
| `TextConditioning`       | `text.py`     | prompts -> conditioning (table, text-embedding cache, CFG halves),    |
| `PooledConditioning`     |               | the precache form; the pooled variant of SD3/SDXL/FLUX.1              |
| `VaeCodec`               | `vae.py`      | latents <-> images and pixels                                         |
| `ClassifierFreeGuidance` | `guidance.py` | CFG over [negative, positive] halves, the detached negative, views    |

`Family` (models/family.py) keeps loading, the trained module with LoRA, FSDP2 blocks, the schedule and sampler
steps, the warm-up loss and export.
"""
