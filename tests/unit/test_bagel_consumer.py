"""The packed batch contract, end to end: BAGEL's training step in miniature (tests/support/bagel_consumer.py: its
trainer's key handling and `Bagel.forward`'s signature, a real tiny diffusers VAE and tiny torch modules) takes our
packs as they are: mixed packs with visual_gen and visual_und on, a VLM-only pack with visual_gen off and a t2i-only
pack with visual_und off (the settings BAGEL's trainer needs for them), with finite losses whose gradients reach
every part the pack holds; the same packs built for `target: unirl` fail there as the issue found; a few optimizer
steps on one pack lower its loss: the batch is trainable, not only well-formed."""

from __future__ import annotations

import pytest
import torch
from bagel_consumer import MiniBagel, train_step

from unirl_core.data.bagel.batch_check import validate_batch
from unirl_core.data.bagel.config import load_mixture
from unirl_core.data.bagel.demo import write_demo_mixture
from unirl_core.data.bagel.loader import open_packer, packing_config
from unirl_core.data.bagel.tokenizer import load_tokenizer

SMALL = {"expected_num_tokens": 1536, "max_num_tokens": 1792, "max_num_tokens_per_sample": 1024,
         "prefer_buffer_before": 768}  # fmt: skip
ALL = ("t2i_pretrain", "unified_edit", "vlm_sft")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_mixture(tmp_path_factory.mktemp("bagel-consumer"))


def packs(demo, groups: tuple[str, ...], count: int, target: str = "bagel") -> tuple[list[dict], int]:
    mixture = load_mixture(demo, target=target)
    mixture.groups = {kind: group for kind, group in mixture.groups.items() if kind in groups}
    for group in mixture.groups.values():
        group.is_mandatory = len(groups) == 1 or group.is_mandatory
    mixture.packing = {**mixture.packing, **SMALL}
    tokenizer = load_tokenizer(mixture.tokenizer)
    packer = open_packer(mixture, tokenizer=tokenizer)
    batches = [next(packer) for _ in range(count)]
    for batch in batches:
        validate_batch(batch, packing_config(mixture))
    return batches, len(tokenizer[0])


@pytest.mark.parametrize(("groups", "visual_gen", "visual_und"), [
    (ALL, True, True),
    (("vlm_sft",), False, True),  # BAGEL's trainer takes a VLM-only pack only with visual_gen off ...
    (("t2i_pretrain",), True, False),  # ... and a t2i-only pack only with visual_und off
])  # fmt: skip
def test_packs_run_through_bagels_training_step(demo, groups, visual_gen, visual_und):
    batches, vocab = packs(demo, groups, 2)
    torch.manual_seed(0)
    model = MiniBagel(vocab, visual_gen=visual_gen, visual_und=visual_und)
    for batch in batches:
        assert ("padded_images" in batch) == visual_gen and ("packed_vit_tokens" in batch) == visual_und
        assert ("ce_loss_indexes" in batch) == visual_und
        if visual_gen:
            noised = torch.isfinite(batch["packed_timesteps"])  # BAGEL reads the noised slots in VAE-slot order ...
            assert torch.equal(batch["packed_vae_token_indexes"][noised], batch["mse_loss_indexes"])  # ... mse order
        model.zero_grad()
        loss, losses = train_step(model, batch)
        assert torch.isfinite(loss) and all(torch.isfinite(value) for value in losses.values()), losses
        loss.backward()
        reached = {name: p.grad is not None and bool(p.grad.abs().sum() > 0) for name, p in model.named_parameters()}
        assert reached["embed.weight"] and reached["attention.in_proj_weight"]
        assert reached["lm_head.weight"] == visual_und and reached["vit.weight"] == visual_und
        assert reached["vae2llm.weight"] == visual_gen and reached["llm2vae.weight"] == visual_gen


def test_unirl_packs_fail_where_the_issue_found_bagels_trainer_failing(demo):
    """`target: unirl` keeps every key: BAGEL's trainer with visual_gen off passes `padded_images` to the model, and
    with visual_und off divides an empty CE by its zero count."""
    (vlm,), vocab = packs(demo, ("vlm_sft",), 1, target="unirl")
    with pytest.raises(TypeError, match="unexpected keyword argument 'padded_images'"):
        train_step(MiniBagel(vocab, visual_gen=False), vlm)
    (t2i,), _ = packs(demo, ("t2i_pretrain",), 1, target="unirl")
    loss, losses = train_step(MiniBagel(vocab, visual_und=False), t2i)
    assert torch.isnan(losses["ce"]) and torch.isnan(loss)


def test_a_few_steps_on_one_pack_lower_its_loss(demo):
    (batch,), vocab = packs(demo, ALL, 1)
    torch.manual_seed(0)
    model = MiniBagel(vocab)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    totals = []
    for _ in range(25):
        model.noise.manual_seed(0)  # the same noise: the target stays fixed
        total, _ = train_step(model, batch)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        totals.append(total.item())
    assert totals[-1] < 0.5 * totals[0], totals
