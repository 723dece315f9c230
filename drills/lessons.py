"""The one lesson list. A lesson is one stem across content/, mine/, solutions/, tests/, mutants/,
benchmarks/ (when it has a benchmark) and notebooks/;
its id is the stem's prefix (`l2` for `l2_paged_decode`). Adding a lesson = adding its files and one
entry here, in course order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Lesson:
    stem: str
    title: str
    track: str  # "T" (Triton basics), "L" (paged KV and serving), "F" (split-KV and beyond), "C" (capstone)

    @property
    def id(self) -> str:
        return self.stem.split("_", 1)[0]

    @property
    def explainer(self) -> Path:
        return ROOT / "drills" / "content" / f"{self.stem}.md"

    @property
    def stub(self) -> Path:
        return ROOT / "drills" / "mine" / f"{self.stem}.py"

    @property
    def solution(self) -> Path:
        return ROOT / "drills" / "solutions" / f"{self.stem}.py"

    @property
    def tests(self) -> Path:
        return ROOT / "drills" / "tests" / f"test_{self.stem}.py"

    @property
    def notebook(self) -> Path:
        return ROOT / "notebooks" / f"{self.stem}.ipynb"

    @property
    def benchmark(self) -> Path:
        """Optional: a lesson has a benchmark when this file exists."""
        return ROOT / "drills" / "benchmarks" / f"{self.stem}.py"

    def module(self, impl: str) -> str:
        """Dotted name of the implementation under test: impl is "mine" or "solutions"."""
        return f"drills.{impl}.{self.stem}"


LESSONS: tuple[Lesson, ...] = (
    Lesson("t1_vector_add", "A first Triton kernel: vector add", "T"),
    Lesson("t2_softmax", "Fused row softmax", "T"),
    Lesson("t3_matmul", "Tiled matmul with tl.dot", "T"),
    Lesson("t4_online_softmax", "Online softmax and merging partial states", "T"),
    Lesson("t5_flash_attention", "FlashAttention forward", "T"),
    Lesson("l1_paged_kv_cache", "Paged KV cache: allocator, block tables, store_kvcache", "L"),
    Lesson("l3_prefix_cache", "Prefix caching with reference counts", "L"),
    Lesson("l2_paged_decode", "Paged decode attention with GQA", "L"),
    Lesson("f1_split_kv_decode", "Split-KV decode with a planner", "F"),
    Lesson("f2_cascade_decode", "Cascade attention: a shared prefix read once", "F"),
    Lesson("f3_fp8_kv_cache", "An FP8 KV cache: half the bytes per decode step", "F"),
    Lesson("l4_paged_prefill", "Paged prefill over a cached prefix (chunked prefill, mixed batches)", "L"),
    Lesson("l5_unified_attention", "One kernel for every step: sliding windows and attention sinks", "L"),
    Lesson("c1_engine", "Capstone: an inference engine serving a real model on your kernels", "C"),
)


def find(lesson_id: str) -> Lesson:
    for lesson in LESSONS:
        if lesson_id in (lesson.id, lesson.stem):
            return lesson
    known = ", ".join(lesson.id for lesson in LESSONS)
    raise SystemExit(f"unknown lesson {lesson_id!r}; known lessons: {known}")
