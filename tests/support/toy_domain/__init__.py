"""A second domain, added as one package outside unirl: a tiny token policy (transformers' GPT-2, shrunk) trained with
GRPO's clipped objective on the tokens it generates. Recipes name it `train.domain.name: toy_domain:TokenDomain`
(this package is on the tests' path; `recipe.yaml` beside this file is one) and score it with
`toy_domain:count_target`. Nothing in unirl names it: tests/integration/test_toy_domain.py trains it through
`unirl train --local` and a 2-worker Ray round, checkpoints, resumes and exports it.
"""

from toy_domain.domain import TokenDomain, TokenDomainConfig, count_target

__all__ = ["TokenDomain", "TokenDomainConfig", "count_target"]
