"""Training drafts on the target's own outputs: teacher data and distillation (``distill``), the training
prompts (``prompts``), the model draft's recipe (``drafts``), the block draft and its recipe (``block``),
the feature-conditioned draft experiment (``feature``). Scripts in ``scripts/`` are their command lines."""
