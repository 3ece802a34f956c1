"""The study around the core: exactness statistics and negative controls (``exactness``, ``mutants``),
timing and benchmarks (``bench``, ``profiling``, ``blas``, ``peers``), the theory (``theory``), the prompt
sets (``prompts``), choosing trees from measurements (``treesearch``) and the shipped model draft's
evaluation and model card (``drafteval``)."""
