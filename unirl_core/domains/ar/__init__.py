"""The autoregressive domain (`train.domain.name: ar`): RL for causal LMs (Qwen3, Qwen2.5, any transformers
`AutoModelForCausalLM` folder) on the same round lifecycle as image diffusion.

| file       | what                                                                                          |
|------------|-----------------------------------------------------------------------------------------------|
| config.py  | `train.domain`'s keys: generation (max new tokens, temperature, top-p, stop strings), chat template |
| policy.py  | the model from a local folder (LoRA or full), batched generation with a KV cache, token log-probs |
| stack.py   | the RL train stack: old/reference log-probs at training geometry, the token algorithm's loss    |
| domain.py  | the `Domain` contract (unirl_core/domains/base.py) on these                                    |

The token algorithms (GRPO, DAPO, Dr. GRPO, GSPO) are `unirl_core/algorithms/token_*.py`; text rewards are
`unirl_core/rewards/text.py`.
"""
