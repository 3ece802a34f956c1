"""Programs built on the study: the GPU reference run (``gpu_reference``, ``scripts/gpu_reference.py``), the draft
evaluation and its model card (``drafteval``, ``scripts/eval_draft.py``), the chapters' set-up (``book``) and the
rendered book (``render``, ``scripts/run_book.py``)."""
