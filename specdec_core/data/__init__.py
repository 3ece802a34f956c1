"""The prompt sets and their loading (``prompts``): the eval mix, Spec-Bench's file, the training prompts' held-out
slice where settings are chosen."""
