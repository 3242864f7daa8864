"""The families added on the contract (FLUX.1, FLUX.2-Klein, Qwen-Image, SDXL, ...) and what each tiny needs in the
demo recipe: shared by their learning tests (tests/integration/test_families.py) and their chain tests
(tests/integration/test_family_chains.py), which sit in two files so the suite's two workers can run them side by side.

The tiny models differ in what LoRA reaches: each entry below names the recipe overrides its tiny needs (the
attention projections alone move a one-block model's images too little).
"""

from __future__ import annotations

FLUX2_LORA = "[to_q,to_k,to_v,to_out.0,add_q_proj,add_k_proj,add_v_proj,to_add_out,ff.linear_in,ff.linear_out,"
FLUX2_LORA += "ff_context.linear_in,ff_context.linear_out,to_qkv_mlp_proj,proj_out,norm_out.linear]"
FAMILIES: dict[str, list[str]] = {  # family -> its tiny's recipe overrides
    "flux": [],
    "flux_schnell": [],
    "flux_kontext": [],
    "flux2_klein": [f"train.model.lora.target_modules={FLUX2_LORA}"],  # the demo's list alone: +0.06 on seed 0
    "qwen_image": [],
    "qwen_image_edit": [],
    # DDPO's sampler; SDXL's tiny UNet has no attention at full resolution: LoRA on conv_out too (without: ~0.00)
    "sdxl": ["train.model.lora.target_modules=[to_q,to_k,to_v,to_out.0,proj_out,conv_out]", "train.algorithm.eta=1.0",
             "train.algorithm.timestep_fraction=0.5"],
}  # fmt: skip


# The families whose whole chain (tests/integration/test_family_chains.py) and stopped-run resume
# (tests/integration/test_families.py) run in `make test`, one per distinct path: a UNet with DDPO's sampler (sdxl),
# an edit family with text-only conditioning and a warm-up (flux_kontext: FLUX.1's packing and pooled text), one
# whose prompts are encoded with their images and no warm-up (qwen_image_edit: the Qwen VAE and VLM). flux,
# flux_schnell, qwen_image and flux2_klein share those paths; each family's golden steps and its checks against the
# stock pipeline (its own precache encoders and warm-up loss included) run for every one.
CHAIN_FAMILIES = ("flux_kontext", "qwen_image_edit", "sdxl")
RESUME_FAMILIES = ("flux_kontext", "qwen_image_edit", "sdxl")


GOLDEN_STEPS = {
    "sdxl": 2
}  # SDXL's tiny moves most per step (grad norm 0.07-0.13, the others' 0.01-0.04) and parts between CPUs after its
# second update: on an AVX512 EPYC against the recording machine, grad norm +0.2 % at step 1, +2.5 % at 2, -25 % at 3


LEARNING_STEPS = {
    "flux2_klein": 24
}  # benchmarks/algorithms.py: at 16 RL steps one seed of 3 clears the margin; at 24 two do


def family_overrides(family: str, folder) -> list[str]:
    """The demo recipe on `family`'s tiny; an edit family trains on edit prompts with condition images."""
    from flows.cli import demo_prompts
    from unirl_core.models.registry import family_class

    overrides = [f"train.model.family={family}", f"train.model.path=tiny:{family}", *FAMILIES[family]]
    if family_class(family).condition_mode == "reference":
        folder.mkdir(parents=True, exist_ok=True)
        overrides += [
            "train.data.source=file",
            f"train.data.data_path={demo_prompts(family, folder, 8)}",
            "train.eval=null",
        ]  # the demo's train.eval: prompt sets without condition images
    return overrides
