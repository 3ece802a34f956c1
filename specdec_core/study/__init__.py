"""The study around the core: exactness statistics and negative controls (``exactness``, ``mutants``),
timing and benchmarks (``bench``, ``profiling``, ``blas``, ``peers``, ``serving``), the theory (``theory``),
the prompt sets (``prompts``), choosing trees from measurements (``treesearch``), evaluating a draft
(``drafteval``), the chapters' shared set-up (``book``) and one way to say a comparison (``report``).
"""
