"""The chapters' measurement library, built on the library below it (see ``specdec_core/README.md``):
timing (``profiling``: the protocol, ceilings and pass costs; ``bench``: methods side by side; ``serving``;
``blas``; ``compiled``: static-shape steps), the theory (``theory``, ``curves``, ``treesearch``, ``hardware``),
exactness (``exactness``, ``mutants``, ``peers``: transformers' decoders under the same tests), choosing settings
(``calibrate``; ``replay``: a rule for K replayed on recorded greedy decodes, without the model), and saying and
drawing results (``report``, ``figures``). Programs that use it live in ``specdec_core/tools``."""
