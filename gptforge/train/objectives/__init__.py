"""What a training step minimises: one `Objective` protocol (base), one module per objective.

- base: the `Objective` protocol, `ObjectiveBase` with the optional members' defaults, `Forward`
  (the policy's forward under autocast), `Layout` (what `setup` sees), `ObjectiveLoss`.
- next_token: `NextToken`, pretraining and completion-only SFT (the default of every run).
- distill: `Distillation`, a frozen teacher's distribution (`gptforge distill`).

A new objective is a new module here with a class deriving from `ObjectiveBase` (docs/extending.md).
"""

from gptforge.train.objectives.base import Forward, Layout, Objective, ObjectiveBase, ObjectiveLoss, Unit, to_device
from gptforge.train.objectives.distill import Distillation
from gptforge.train.objectives.next_token import NextToken

__all__ = ["Distillation", "Forward", "Layout", "NextToken", "Objective", "ObjectiveBase", "ObjectiveLoss", "Unit",
           "to_device"]
