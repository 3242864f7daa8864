"""The packed batch contract, end to end: BAGEL's training forward in miniature (tests/support/bagel_consumer.py, a
real tiny diffusers VAE and tiny torch modules) takes our packs as they are (mixed packs, a pack with no VAE image,
a pack with no ViT image), gives finite losses whose gradients reach every part the pack holds, and a few optimizer
steps on one pack lower its loss: the batch is trainable, not only well-formed."""

from __future__ import annotations

import pytest
import torch
from bagel_consumer import MiniBagel

from unirl_core.data.bagel.batch_check import validate_batch
from unirl_core.data.bagel.config import load_mixture
from unirl_core.data.bagel.demo import write_demo_mixture
from unirl_core.data.bagel.loader import open_packer, packing_config
from unirl_core.data.bagel.tokenizer import load_tokenizer

SMALL = {"expected_num_tokens": 1536, "max_num_tokens": 1792, "max_num_tokens_per_sample": 1024,
         "prefer_buffer_before": 768}  # fmt: skip


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_mixture(tmp_path_factory.mktemp("bagel-consumer"))


def packs(demo, groups: tuple[str, ...], count: int) -> tuple[list[dict], int]:
    mixture = load_mixture(demo)
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


@pytest.mark.parametrize(("groups", "has_vae", "has_vit"), [
    (("t2i_pretrain", "unified_edit", "vlm_sft"), True, True),
    (("vlm_sft",), False, True),  # no VAE image: BAGEL's own trainer crashes on such a pack
    (("t2i_pretrain",), True, False),  # no ViT image
])  # fmt: skip
def test_packs_run_through_bagels_forward_and_backward(demo, groups, has_vae, has_vit):
    batches, vocab = packs(demo, groups, 2)
    torch.manual_seed(0)
    model = MiniBagel(vocab)
    for batch in batches:
        assert (len(batch["mse_loss_indexes"]) > 0) == has_vae and (len(batch["vit_token_seqlens"]) > 0) == has_vit
        noised = torch.isfinite(batch["packed_timesteps"])  # BAGEL reads the noised slots in VAE-slot order ...
        assert torch.equal(batch["packed_vae_token_indexes"][noised], batch["mse_loss_indexes"])  # ... = mse order
        model.zero_grad()
        losses = model(batch, torch.Generator().manual_seed(0))
        assert all(torch.isfinite(loss) for loss in losses.values()), losses
        (losses["ce"] + losses["mse"]).backward()
        reached = {name: p.grad is not None and bool(p.grad.abs().sum() > 0) for name, p in model.named_parameters()}
        assert reached["embed.weight"] and reached["attention.in_proj_weight"]
        assert reached["lm_head.weight"] == (len(batch["ce_loss_indexes"]) > 0)  # t2i captions carry no text loss
        assert reached["vit.weight"] == has_vit and reached["vae2llm.weight"] == has_vae
        assert reached["llm2vae.weight"] == has_vae


def test_a_few_steps_on_one_pack_lower_its_loss(demo):
    (batch,), vocab = packs(demo, ("t2i_pretrain", "unified_edit", "vlm_sft"), 1)
    torch.manual_seed(0)
    model = MiniBagel(vocab)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    totals = []
    for _ in range(25):
        losses = model(batch, torch.Generator().manual_seed(0))  # the same noise: the target stays fixed
        total = losses["ce"] + losses["mse"]
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        totals.append(total.item())
    assert totals[-1] < 0.5 * totals[0], totals
