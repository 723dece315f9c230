"""Which code the engine runs: your file of a lesson where it passes its grader, the reference otherwise.

The engine needs eight lessons: L1's store_kvcache, L3's BlockManager, L4's paged_prefill, F1's plan and
split_kv_decode, F2's plan (as cascade_plan) and cascade_decode, L5's plan (as unified_plan) and
unified_attention (for layers with a sliding window or sinks), F3's store_kvcache_fp8, fp8_decode and plan
(as fp8_plan; for an e4m3 KV cache), and C1's scheduler and prepare_inputs. A lesson uses drills/mine/<stem>.py when the
last `make test` of that file, as it is now, passed (the grade is remembered in .drills/, never
re-run here: grading takes a minute); otherwise the reference in drills/solutions/. `describe()` gives
the lines the engine prints at start-up, so a learner always knows whose code answered.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import SimpleNamespace

from drills import lessons

# stem -> the names the engine takes from it; (name, as) where two lessons use one name
PARTS = {
    "l1_paged_kv_cache": ("store_kvcache",),
    "l3_prefix_cache": ("BlockManager",),
    "l4_paged_prefill": ("paged_prefill",),
    "f1_split_kv_decode": ("plan", "split_kv_decode"),
    "f2_cascade_decode": (("plan", "cascade_plan"), "cascade_decode"),
    "l5_unified_attention": (("plan", "unified_plan"), "unified_attention"),
    "f3_fp8_kv_cache": ("store_kvcache_fp8", "fp8_decode", ("plan", "fp8_plan")),
    "c1_engine": ("Scheduler", "Sequence", "SamplingParams", "prepare_inputs"),
}


def _names(stem: str) -> list[tuple[str, str]]:
    """(the name in the lesson's module, the name in the engine's namespace) for each part of `stem`."""
    return [(n, n) if isinstance(n, str) else n for n in PARTS[stem]]


def _listed(stem: str) -> str:
    return ", ".join(name for name, _ in _names(stem))


CHOICES = ("auto", "solutions", "mine")


@dataclass(frozen=True)
class Choice:
    lesson: lessons.Lesson
    impl: str  # "mine" or "solutions"
    why: str

    @property
    def line(self) -> str:
        who = "yours" if self.impl == "mine" else "reference"
        return f"  {self.lesson.id} {_listed(self.lesson.stem)}: {who} ({self.why})"


def choose(use: str = "auto") -> dict[str, Choice]:
    """use: "auto" (yours where passing), "solutions" (every reference) or "mine" (every file of yours,
    passing or not: for debugging your engine against its grader's failures)."""
    if use not in CHOICES:
        raise ValueError(f"use must be one of {CHOICES}, got {use!r}")
    from drills import learner

    chosen = {}
    for stem in PARTS:
        lesson = lessons.find(stem)
        if use != "auto":
            chosen[stem] = Choice(lesson, use, f"use={use}")
            continue
        grade = learner.known_grade(lesson)
        if grade and grade.get("state") == "passing":
            chosen[stem] = Choice(lesson, "mine", "passes make test")
        elif learner.is_untouched_stub(lesson):
            chosen[stem] = Choice(lesson, "solutions", "yours: not started")
        else:
            state = grade.get("state") if grade else "not graded as it is now"
            chosen[stem] = Choice(lesson, "solutions", f"yours: {state}; make test L={lesson.id}")
    return chosen


def load(choices: dict[str, Choice]) -> SimpleNamespace:
    """One namespace with every part the engine calls (parts.store_kvcache, parts.Scheduler, ...)."""
    parts = {}
    for stem in PARTS:
        module = importlib.import_module(choices[stem].lesson.module(choices[stem].impl))
        for name, alias in _names(stem):
            parts[alias] = getattr(module, name)
    return SimpleNamespace(**parts)


# The lessons whose parts an e4m3 KV cache (kv_cache_dtype="fp8_e4m3") replaces by F3's.
FP8_REPLACES = ("l1_paged_kv_cache", "f1_split_kv_decode", "f2_cascade_decode")

# The lessons whose code only the kernel attention path calls: with attention in torch they do not run.
KERNEL_PATH = (
    "l1_paged_kv_cache",
    "l4_paged_prefill",
    "f1_split_kv_decode",
    "f2_cascade_decode",
    "l5_unified_attention",
)


def describe(
    choices: dict[str, Choice],
    attention: str = "kernels",
    fused_store: bool = False,
    unified: bool = False,
    fp8: bool = False,
) -> list[str]:
    """The start-up lines: whose code each part is, and which parts are not called at all: with
    attention in torch the kernel path's (the torch path stores and attends K and V itself), with
    fused_store L1's (the fused RoPE kernel stores K and V), without `unified` (no layer has a sliding
    window or sinks) L5's."""
    lines = ["the engine runs:"]
    for stem, choice in choices.items():
        # fp8: the KV cache is e4m3 (EngineConfig.kv_cache_dtype), which F3 stores and decodes in place
        # of L1's store and F1's and F2's decode; otherwise F3 is not called.
        if stem == "f3_fp8_kv_cache" and (not fp8 or attention != "kernels"):
            why = "attention in torch" if fp8 else "LLM(kv_cache_dtype='fp8_e4m3') calls it"
            lines.append(f"  {choice.lesson.id} {_listed(stem)}: not called ({why})")
            continue
        if fp8 and attention == "kernels" and stem in FP8_REPLACES:
            lines.append(f"  {choice.lesson.id} {_listed(stem)}: not called (the KV cache is e4m3: F3's run)")
            continue
        if attention != "kernels" and stem in KERNEL_PATH:
            lines.append(f"  {choice.lesson.id} {_listed(stem)}: not called (attention in torch)")
        elif not unified and stem == "l5_unified_attention":
            lines.append(f"  {choice.lesson.id} {_listed(stem)}: not called (no layer has a window or sinks)")
        elif fused_store and stem == "l1_paged_kv_cache":
            lines.append(
                f"  {choice.lesson.id} {_listed(stem)}: not called (the fused RoPE kernel stores K and V; "
                "make chat ARGS=--l1-store, or LLM(fused_store=False), calls it)"
            )
        else:
            lines.append(choice.line)
    return lines
