"""Training drafts on the target's own outputs: teacher records (``teacher``, the one module that makes and loads
them), distillation (``distill``), the training prompts (``prompts``, ``wide``), the model draft's recipe
(``drafts``), the block draft and its recipe (``block``), the learning curve (``curve``), the feature-conditioned
draft experiment (``feature``). Scripts in ``scripts/`` are their command lines."""
