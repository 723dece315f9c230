"""Decode steps' inputs kept on the device: block tables that stay on the GPU between steps, with only
new block ids written, and positions, slots and lengths computed there.

Your C1 prepare_inputs builds every step's tensors on the host: for a decode step of 256 sequences some
8,000 block ids, their slots and lengths, rebuilt every step though only one sequence in 16 gains a block
(block size 16). DeviceBatch keeps a row of block ids on the device for each sequence of the batch and,
for a decode step, sends only what changed: each row's last token, its row and its position (three ints
a sequence) and the block ids appended since the last step. The device gathers the step's block tables
from the rows and computes each position's slot and context length, as vLLM's Model Runner V2
(vllm/v1/worker/gpu/block_table.py) and mini-sglang keep their tables on the GPU.

Your prepare_inputs stays the source of truth: every step that is not a steady decode step (prompt
tokens, a sequence new to the batch, one readmitted after a preemption, one skipped a step) is built by
it, and its block tables are copied into the rows on the device; a decode step is built here only when
every sequence in it was in the step before and computes the token after the one it computed there.
With `check` on, every step built here is compared with what prepare_inputs builds for it (the tests).
"""

from __future__ import annotations

import array
from types import SimpleNamespace

import torch

# A sequence's record: [row on the device, position computed last, pages written, preemptions, step seen]
ROW, LAST, PAGES, PREEMPTIONS, SEEN = range(5)


class DeviceBatch:
    """Block-table rows on the device, one per sequence of the batch, and the decode steps built from them.

    max_num_seqs   sequences in one step at most (the rows; one more, all zeros, for padding rows)
    max_model_len  the longest sequence (each row's width, in pages of block_size)
    staging        the engine's pinned host-to-device copier (engine._Staging), or None: a plain copy
    """

    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int, device, staging=None):
        self.page = block_size
        self.width = -(-max_model_len // block_size)
        self.device = torch.device(device)
        self.zero_row = max_num_seqs  # padding rows read this row: all zeros, never written
        self.tables = torch.zeros(max_num_seqs + 1, self.width, dtype=torch.int32, device=self.device)
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))
        self.records: dict = {}  # seq_id -> record (ROW, LAST, PAGES, PREEMPTIONS, SEEN)
        self.staging = staging
        self.step = 0  # steps seen, built here or registered from prepare_inputs
        self.built = 0  # steps built here
        self.check = None  # prepare_inputs to compare every step built here with (tests), or None
        self._aranges: dict = {}

    def build(self, scheduled, block_manager, pad_to: int | None = None):
        """The inputs of a steady decode step, built on the device from the rows (StepInputs' fields), or
        None when the step is not one: prepare_inputs builds it, then register() brings the rows up to
        date. pad_to: the CUDA graph's batch, as prepare_inputs takes it."""
        page, step = self.page, self.step
        ids, rows, pos, writes, grown = [], [], [], [], []
        for item in scheduled:
            seq = item.seq
            rec = self.records.get(seq.seq_id)
            p = seq.num_computed
            if (
                rec is None
                or item.num_new != 1
                or rec[SEEN] != step
                or rec[LAST] != p - 1
                or p + 1 != seq.num_tokens
                or rec[PREEMPTIONS] != seq.preemptions
            ):
                return None
            k = p // page
            if k >= rec[PAGES]:  # the position starts a block this row has not had yet
                table = block_manager.block_table(seq.seq_id)
                for c in range(rec[PAGES], k + 1):
                    writes += (rec[ROW], c, table[c])
                grown.append((rec, k + 1))
            output = seq.output
            ids.append(output[-1] if output else seq.prompt[-1])  # the token at p: the last one
            rows.append(rec[ROW])
            pos.append(p)
        n = len(scheduled)
        for rec, pages in grown:
            rec[PAGES] = pages
        for item, p in zip(scheduled, pos):
            rec = self.records[item.seq.seq_id]
            rec[LAST], rec[SEEN] = p, step + 1
        if len(self.records) != n:
            self._drop_others(scheduled)
        self.step += 1
        self.built += 1
        b = n if pad_to is None else pad_to
        if b < n:
            raise ValueError(f"pad_to={pad_to} pads decode steps of at most {pad_to} sequences")
        ids += [0] * (b - n)
        rows += [self.zero_row] * (b - n)
        pos += [-1] * (b - n)  # a padding row: position -1 gives slot -1 and context length 0
        inputs = self._tensors(self._send(ids + rows + pos + writes), b, n, len(writes) // 3)
        inputs.context_lens_list = [p + 1 for p in pos]
        if self.check is not None:
            self._compare(inputs, self.check(scheduled, block_manager, self.device, pad_to=pad_to))
        return inputs

    def _tensors(self, packed, b: int, n: int, num_writes: int):
        """The step's tensors from the packed ints: ids (b), rows (b), positions (b), then the writes."""
        page = self.page
        ids, rows, pos = packed[:b], packed[b : 2 * b], packed[2 * b : 3 * b]
        if num_writes:
            w = packed[3 * b :].view(num_writes, 3)  # (row, column, block id) of each new entry
            self.tables[w[:, 0], w[:, 1]] = w[:, 2].to(torch.int32)
        tables = self.tables.index_select(0, rows)  # (b, width) int32
        positions = pos.clamp(min=0)  # (b,) int64
        block = tables.gather(1, (positions // page)[:, None]).squeeze(1).long()  # (b,)
        slots = torch.where(pos >= 0, block * page + positions % page, -1)  # (b,) int64
        if b not in self._aranges:
            self._aranges[b] = (
                torch.arange(b + 1, dtype=torch.int32, device=self.device),
                torch.arange(b, dtype=torch.int64, device=self.device),
            )
        cu, every = self._aranges[b]
        return SimpleNamespace(
            input_ids=ids,
            positions=positions,
            slot_mapping=slots,
            cu_seqlens_q=cu,
            context_lens=(pos + 1).to(torch.int32),
            block_tables=tables,
            logits_rows=every[:n],  # every real row samples; padding rows do not
            sample_index=list(range(n)),
            is_decode=True,
            query_lens=[1] * b,
            num_seqs=n,
        )

    def rows_for(self, scheduled, inputs) -> None:
        """Before a step prepare_inputs built is sent to the device: give each of its sequences a row and
        bring its record up to the step, and add the rows to `inputs` (inputs.batch_rows, (B,) int64 on
        the host), so that they travel in the same copy as the step's tensors."""
        self.step += 1
        self._drop_others(scheduled)
        rows = []
        for item, ctx in zip(scheduled, inputs.context_lens_list):
            seq = item.seq
            rec = self.records.get(seq.seq_id)
            if rec is None:
                rec = self.records[seq.seq_id] = [self.free_rows.pop(), 0, 0, 0, 0]
            # The columns past the row's pages hold prepare_inputs' padding zeros: PAGES counts only the
            # pages the cached tokens fill, so the block a later position needs is fetched then.
            rec[LAST], rec[PAGES] = ctx - 1, -(-ctx // self.page)
            rec[PREEMPTIONS], rec[SEEN] = seq.preemptions, self.step
            rows.append(rec[ROW])
        inputs.batch_rows = torch.frombuffer(array.array("q", rows), dtype=torch.int64) if rows else None

    def register(self, inputs) -> None:
        """After the step is on the device: its block tables (inputs.block_tables) copied into the rows
        rows_for gave its sequences."""
        rows = inputs.batch_rows
        if rows is None:
            return
        rows = rows.to(self.device, non_blocking=True)  # on the device already where it was sent with them
        tables = inputs.block_tables[: rows.shape[0]]  # (B, w) int32; padding rows after them
        self.tables[:, : tables.shape[1]].index_copy_(0, rows, tables.to(torch.int32))

    def _send(self, values: list[int]) -> torch.Tensor:
        """values as an int64 tensor on the device, through the pinned staging buffers where there are:
        a pageable copy would wait for the GPU to finish the step before."""
        host = torch.frombuffer(array.array("q", values), dtype=torch.int64)
        if self.staging is not None:
            return self.staging.send(SimpleNamespace(packed=host)).packed
        return host.to(self.device, non_blocking=True)

    def _drop_others(self, scheduled) -> None:
        """Free the rows of sequences not in this step (finished, preempted, or left out by the budget):
        a sequence that comes back is built by prepare_inputs first."""
        ids = {item.seq.seq_id for item in scheduled}
        for seq_id in [s for s in self.records if s not in ids]:
            self.free_rows.append(self.records.pop(seq_id)[ROW])

    def _compare(self, ours, theirs) -> None:
        """Every field the step's kernels read, against prepare_inputs' (block tables up to each row's
        pages: past them the kernels read nothing)."""
        for name in ("input_ids", "positions", "slot_mapping", "context_lens", "logits_rows"):
            a, b = getattr(ours, name), getattr(theirs, name).to(self.device)
            if not torch.equal(a, b):
                raise AssertionError(f"{name}: built on the device {a.tolist()}, prepare_inputs {b.tolist()}")
        if ours.sample_index != list(theirs.sample_index):
            raise AssertionError(f"sample_index: {ours.sample_index} against {theirs.sample_index}")
        for r, ctx in enumerate(theirs.context_lens_list):
            k = -(-ctx // self.page)
            a, b = ours.block_tables[r, :k], theirs.block_tables[r, :k].to(self.device)
            if not torch.equal(a, b):
                raise AssertionError(
                    f"block_tables row {r}: built on the device {a.tolist()}, prepare_inputs {b.tolist()}"
                )
