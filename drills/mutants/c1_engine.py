"""C1 mutants: the scheduler and input-preparation mistakes of explainer section 5, one or more per pitfall."""

from drills.mutants import Mutant

MUTANTS = [
    Mutant(
        "slot_off_by_one",
        "1. a slot off by one",
        "slot = table[p // page] * page + p % page",
        "slot = table[p // page] * page + (p + 1) % page",
    ),
    Mutant(
        "context_without_the_steps_tokens",
        "2. context lengths without the step's own tokens",
        "ctx.append(start + n)",
        "ctx.append(start)",
    ),
    Mutant(
        "chunk_short_of_the_prompt_samples",
        "3. a token sampled where there is none (a chunk short of the prompt's end)",
        "            if not samples:\n                continue",
        "            pass",
    ),
    Mutant(
        "logits_row_of_the_first_new_token",
        "3. a token sampled where there is none (the chunk's first row)",
        "rows.append(cu[-1] - 1)",
        "rows.append(cu[-2])",
    ),
    Mutant(
        "hits_trusted_before_computed",
        "4. prefix hits trusted before their K and V exist",
        "while usable < hits and table[usable] in self.computed_blocks:",
        "while usable < hits:",
    ),
    Mutant(
        "hits_counted_anywhere_in_the_table",
        "4. prefix hits trusted before their K and V exist (computed hits counted wherever they lie)",
        "            usable = 0\n"
        "            while usable < hits and table[usable] in self.computed_blocks:\n"
        "                usable += 1\n",
        "            usable = sum(1 for block in table[:hits] if block in self.computed_blocks)\n",
    ),
    Mutant(
        "half_written_block_marked_computed",
        "34. a block marked computed before its last slot is written",
        "            if seq.num_computed // self.block_size > before // self.block_size:\n"
        "                table = self.block_manager.block_table(seq.seq_id)\n"
        "                self.computed_blocks.update(\n"
        "                    table[before // self.block_size : seq.num_computed // self.block_size]\n"
        "                )\n",
        "            if True:  # every block the step wrote into\n"
        "                table = self.block_manager.block_table(seq.seq_id)\n"
        "                self.computed_blocks.update(\n"
        "                    table[before // self.block_size : -(-seq.num_computed // self.block_size)]\n"
        "                )\n",
    ),
    Mutant(
        "readmission_keeps_its_old_counters",
        "8. a preempted request readmitted with stale state (resumed where it stopped)",
        "seq.num_computed = min(usable * self.block_size, seq.num_tokens - 1)",
        "seq.num_computed = seq.num_tokens - 1 if seq.preemptions else min(usable * self.block_size, "
        "seq.num_tokens - 1)",
    ),
    Mutant(
        "whole_prompt_cached_computes_nothing",
        "5. a prompt found whole in the cache computes nothing",
        "seq.num_computed = min(usable * self.block_size, seq.num_tokens - 1)",
        "seq.num_computed = usable * self.block_size",
    ),
    Mutant(
        "chunk_not_capped_by_the_budget",
        "6. a prompt chunk not capped by the token budget",
        "self.running.append(seq)\n            num_new = min(seq.num_tokens - seq.num_computed, budget)",
        "self.running.append(seq)\n            num_new = seq.num_tokens - seq.num_computed",
    ),
    Mutant(
        "decode_rows_take_no_budget",
        "6. a prompt chunk not capped by the token budget (decode rows take nothing from it)",
        "            budget -= num_new\n            i += 1\n",
        "            budget -= num_new if num_new > 1 else 0\n            i += 1\n",
    ),
    Mutant(
        "finished_blocks_not_freed",
        "7. a finished request's blocks not freed",
        "                self.running.remove(seq)\n                self.block_manager.free(seq.seq_id)\n"
        "                finished.append(seq)\n",
        "                self.running.remove(seq)\n                finished.append(seq)\n",
    ),
    Mutant(
        "readmitted_from_its_prompt_alone",
        "8. a preempted request readmitted with stale state",
        "table = self.block_manager.allocate(seq.seq_id, seq.tokens)",
        "table = self.block_manager.allocate(seq.seq_id, seq.prompt)",
    ),
    Mutant(
        "block_table_kept_from_the_first_step",
        "9. a stale block table",
        "        table = block_manager.block_table(seq.seq_id)\n",
        "        if not hasattr(seq, 'table'):  # kept from the sequence's first step\n"
        "            seq.table = block_manager.block_table(seq.seq_id)\n"
        "        table = seq.table\n",
    ),
    Mutant(
        "computed_blocks_never_marked",
        "10. computed blocks never marked",
        "                self.computed_blocks.update(\n"
        "                    table[before // self.block_size : seq.num_computed // self.block_size]\n"
        "                )\n",
        "",
    ),
    Mutant(
        "fresh_blocks_keep_their_old_mark",
        "11. fresh blocks keep an old computed mark",
        "            self.computed_blocks.difference_update(table[hits:])\n",
        "",
    ),
    Mutant(
        "padding_rows_write_slot_0",
        "12. padding rows that write or attend",
        "            slots.append(-1)\n            cu.append(cu[-1] + 1)",
        "            slots.append(0)\n            cu.append(cu[-1] + 1)",
    ),
    Mutant(
        "padding_rows_claim_context",
        "12. padding rows that write or attend",
        "            ctx.append(0)\n            tables.append([])",
        "            ctx.append(1)\n            tables.append([])",
    ),
    Mutant(
        "oldest_sequence_preempted",
        "13. preempting a sequence already in the step (the oldest)",
        "victim = self.running[-1]",
        "victim = self.running[0]",
    ),
    Mutant(
        "shared_slot_written_twice",
        "14. a slot written twice in one step",
        "slots.append(-1 if slot in seen else slot)",
        "slots.append(slot)",
    ),
    Mutant(
        "eos_never_stops",
        "15. a request that never stops at the end-of-sequence token",
        "stop = token == seq.eos_id and not seq.params.ignore_eos",
        "stop = False  # max_tokens alone ends a request",
    ),
    Mutant(
        "eos_overrides_ignore_eos",
        "16. ignore_eos ignored",
        "stop = token == seq.eos_id and not seq.params.ignore_eos",
        "stop = token == seq.eos_id",
    ),
    Mutant(
        "chunked_without_chunked_prefill",
        "17. chunks without chunked prefill",
        "if not self.chunked_prefill and seq.num_tokens > budget:",
        "if not self.chunked_prefill and seq.num_tokens > self.max_num_batched_tokens:",
    ),
    Mutant(
        "inputs_left_on_the_host",
        "18. step inputs left on the host",
        "return host.to(device, non_blocking=True)",
        "return host",
    ),
    Mutant(
        "block_tables_int64",
        "19. step inputs in another dtype (int64 block tables)",
        "block_tables=tensor(flat, torch.int32)",
        "block_tables=tensor(flat, torch.int64)",
    ),
    Mutant(
        "cu_seqlens_int64",
        "19. step inputs in another dtype (int64 cu_seqlens_q)",
        "cu_seqlens_q=tensor(cu, torch.int32)",
        "cu_seqlens_q=tensor(cu, torch.int64)",
    ),
    Mutant(
        "preempted_to_the_back_of_the_queue",
        "20. a preempted request sent to the back of the queue",
        "self.waiting.appendleft(seq)",
        "self.waiting.append(seq)",
    ),
    Mutant(
        "preemption_not_counted_on_the_request",
        "21. preemptions not counted",
        "        seq.preemptions += 1\n",
        "",
    ),
    Mutant(
        "num_cached_raw_hits",
        "22. num_cached from the raw prefix hits",
        "seq.num_cached = seq.num_computed",
        "seq.num_cached = hits * self.block_size",
    ),
    Mutant(
        "num_cached_from_the_manager",
        "22. num_cached from the raw prefix hits (L3's count)",
        "seq.num_cached = seq.num_computed",
        "seq.num_cached = self.block_manager.num_cached_tokens(seq.seq_id)",
    ),
    Mutant(
        "admits_after_preemption",
        "23. admission after a preemption in the same step",
        "len(self.running) < self.max_num_seqs and not preempted:",
        "len(self.running) < self.max_num_seqs:",
    ),
    Mutant(
        "chunk_blocks_not_marked",
        "10. computed blocks marked only by a step that samples (a prompt chunk's blocks never are)",
        "            seq.num_computed += item.num_new\n",
        "            seq.num_computed += item.num_new\n            if not samples:\n                continue\n",
    ),
    Mutant(
        "token_ids_copied_once",
        "24. token ids kept from an earlier step",
        "        ids += _tokens_between(seq, start, start + n)  # read now: tokens grow and change every step\n",
        "        if not hasattr(seq, 'ids_copy'):\n"
        "            seq.ids_copy = []  # a copy, grown by what is new\n"
        "        seq.ids_copy += seq.tokens[len(seq.ids_copy) :]\n"
        "        ids += seq.ids_copy[start : start + n]\n",
    ),
    Mutant(
        "last_token_kept_by_postprocess",
        "24. token ids kept from an earlier step (the last token, kept by postprocess for decode rows)",
        "            seq.output.append(token)\n"
        "            stop = token == seq.eos_id and not seq.params.ignore_eos\n"
        "            if stop or len(seq.output) >= seq.params.max_tokens:\n"
        "                seq.status = FINISHED\n"
        "                self.running.remove(seq)\n"
        "                self.block_manager.free(seq.seq_id)\n"
        "                finished.append(seq)\n"
        "        return finished\n"
        "\n"
        "\n"
        "def _tokens_between(seq: Sequence, start: int, end: int) -> list[int]:\n"
        '    """seq.tokens[start:end], read from prompt and output directly (a new list, as seq.tokens is)."""\n'
        "    k = len(seq.prompt)\n",
        "            seq.output.append(token)\n"
        "            seq.last_token = token  # the next decode row's input, kept\n"
        "            stop = token == seq.eos_id and not seq.params.ignore_eos\n"
        "            if stop or len(seq.output) >= seq.params.max_tokens:\n"
        "                seq.status = FINISHED\n"
        "                self.running.remove(seq)\n"
        "                self.block_manager.free(seq.seq_id)\n"
        "                finished.append(seq)\n"
        "        return finished\n"
        "\n"
        "\n"
        "def _tokens_between(seq: Sequence, start: int, end: int) -> list[int]:\n"
        '    """seq.tokens[start:end], read from prompt and output directly (a new list, as seq.tokens is)."""\n'
        "    k = len(seq.prompt)\n"
        "    if end - start == 1 and end == seq.num_tokens and seq.output:\n"
        "        return [seq.last_token]  # a row of one token after the prompt: the token postprocess kept\n",
    ),
    Mutant(
        "random_stream_restarted_on_preemption",
        "25. a preempted request's random draws restarted",
        "        seq.num_computed = 0\n        seq.num_slots = 0\n",
        "        seq.num_computed = 0\n        seq.num_slots = 0\n"
        "        seq.generator = None  # recomputed from scratch, its sampling too\n",
    ),
    Mutant(
        "eos_checked_on_decode_rows_only",
        "15. a request that never stops at the end-of-sequence token (checked on decode rows only)",
        "stop = token == seq.eos_id and not seq.params.ignore_eos",
        "stop = item.num_new == 1 and token == seq.eos_id and not seq.params.ignore_eos",
    ),
    Mutant(
        "add_checks_the_prompt_alone",
        "26. a request accepted that can never be recomputed whole",
        "if not self.chunked_prefill and need - 1 > self.max_num_batched_tokens:",
        "if not self.chunked_prefill and seq.num_tokens > self.max_num_batched_tokens:",
    ),
    Mutant(
        "recompute_bound_one_too_tight",
        "26. add() refuses a request that fits exactly: need where need - 1 belongs",
        "if not self.chunked_prefill and need - 1 > self.max_num_batched_tokens:",
        "if not self.chunked_prefill and need > self.max_num_batched_tokens:",
    ),
    Mutant(
        "non_finite_sampling_values_accepted",
        "27. non-finite sampling values accepted",
        '        for name in ("temperature", "top_p", "max_tokens", "random_state", "ignore_eos", "top_k", "min_p"):\n'
        "            value = getattr(self, name)\n"
        "            if isinstance(value, float) and not math.isfinite(value):\n"
        '                raise ValueError(f"{name} must be finite, got {value}")\n',
        "",
    ),
    Mutant(
        "admission_skips_a_blocked_head",
        "28. admission that skips a blocked head of the queue",
        "            seq = self.waiting[0]\n"
        "            if not self.chunked_prefill and seq.num_tokens > budget:\n"
        "                break\n"
        "            try:\n"
        "                table = self.block_manager.allocate(seq.seq_id, seq.tokens)\n"
        "            except ValueError:\n"
        "                break\n"
        "            self.waiting.popleft()\n",
        "            for seq in self.waiting:  # the first waiting request that fits\n"
        "                if self.chunked_prefill or seq.num_tokens <= budget:\n"
        "                    try:\n"
        "                        table = self.block_manager.allocate(seq.seq_id, seq.tokens)\n"
        "                        break\n"
        "                    except ValueError:\n"
        "                        pass\n"
        "            else:\n"
        "                break\n"
        "            self.waiting.remove(seq)\n",
    ),
    Mutant(
        "scheduled_request_preempts_itself",
        "29. the request being scheduled preempted instead of the newest",
        "victim = self.running[-1]",
        "victim = seq",
    ),
    Mutant(
        "blocks_marked_from_the_next_whole_block",
        "10. computed blocks never marked (a block finished by a later step than the one that began it)",
        "table[before // self.block_size : seq.num_computed // self.block_size]",
        "table[-(-before // self.block_size) : seq.num_computed // self.block_size]",
    ),
    Mutant(
        "admission_takes_one_request_a_step",
        "30. admission that stops while the step has room (one request a step)",
        "        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:\n",
        "        for _ in range(1 if self.waiting and budget > 0 and len(self.running) < self.max_num_seqs "
        "and not preempted else 0):\n",
    ),
    Mutant(
        "decode_step_when_every_row_samples",
        "31. a step called decode because every row samples",
        "is_decode = all(item.num_new == 1 for item in scheduled)",
        "is_decode = all(item.samples for item in scheduled)",
    ),
    Mutant(
        "one_token_past_max_tokens",
        "32. one token past max_tokens",
        "if stop or len(seq.output) >= seq.params.max_tokens:",
        "if stop or len(seq.output) > seq.params.max_tokens:",
    ),
    Mutant(
        "one_sequence_past_max_num_seqs",
        "35. more sequences in a step than max_num_seqs",
        "len(self.running) < self.max_num_seqs and not preempted:",
        "len(self.running) <= self.max_num_seqs and not preempted:",
    ),
    Mutant(
        "preempts_while_the_last_block_has_room",
        "36. a preemption when the next token fits its last block",
        "if seq.num_slots % self.block_size == 0 and self.block_manager.num_free_blocks == 0:",
        "if self.block_manager.num_free_blocks == 0:",
    ),
    Mutant(
        "block_tables_padded_with_minus_one",
        "37. block-table rows padded with something other than 0",
        "        flat += [0] * (width - len(t))\n",
        "        flat += [-1] * (width - len(t))\n",
    ),
    Mutant(
        "eos_id_0_read_as_no_eos",
        "38. eos_id 0 read as no end-of-sequence token",
        "stop = token == seq.eos_id and not seq.params.ignore_eos",
        "stop = token == (seq.eos_id or -1) and not seq.params.ignore_eos",
    ),
    Mutant(
        "preempted_request_left_running",
        "39. a status that does not say where the request is (a preempted request left RUNNING)",
        "        seq.status = WAITING\n        seq.num_computed = 0\n",
        "        seq.num_computed = 0\n",
    ),
    Mutant(
        "admitted_request_left_waiting",
        "39. a status that does not say where the request is (an admitted request left WAITING)",
        "            seq.status = RUNNING\n",
        "",
    ),
    Mutant(
        "prompt_that_fits_later_waits",
        "30. admission that stops while the step has room (a prompt that fits a later step whole waits)",
        "if not self.chunked_prefill and seq.num_tokens > budget:",
        "if seq.num_tokens > budget and (not self.chunked_prefill or seq.num_tokens <= self.max_num_batched_tokens):",
    ),
    Mutant(
        "full_graph_batch_refused",
        "40. a graph batch filled exactly refused",
        "if not is_decode or pad_to < num_seqs:",
        "if not is_decode or pad_to <= num_seqs:",
    ),
    Mutant(
        "self_preemption_not_noticed",
        "41. a sequence that preempted itself still given slots",
        "                self.preempt(victim)\n                if victim is seq:\n                    return False\n",
        "                self.preempt(victim)\n",
    ),
    Mutant(
        "preemption_folds_the_output_into_the_prompt",
        "8. a preempted request readmitted with stale state (its output folded into its prompt)",
        "        seq.num_slots = 0\n        seq.preemptions += 1\n",
        "        seq.num_slots = 0\n        seq.prompt, seq.output = seq.tokens, []  # recomputed as one prompt\n"
        "        seq.preemptions += 1\n",
    ),
    Mutant(
        "written_slots_kept_between_steps",
        "14. a slot written twice in one step (the step's set of written slots kept from step to step)",
        "    seen = set()  # slots written by this step\n",
        '    seen = _TYPECODES.setdefault("seen", set())  # kept at module level, from step to step\n',
    ),
    Mutant(
        "num_cached_of_the_first_admission",
        "22. num_cached from the raw prefix hits (the first admission's, kept past a readmission)",
        "            seq.num_cached = seq.num_computed\n",
        "            if not seq.preemptions:\n                seq.num_cached = seq.num_computed\n",
    ),
    Mutant(
        "pool_exact_fit_refused",
        "33. a request that fills the pool exactly refused",
        "        if need > capacity:\n",
        "        if need >= capacity:\n",
    ),
    Mutant(
        "one_token_row_reads_the_last_output",
        "42. a row of one token read as a decode row",
        "        ids += _tokens_between(seq, start, start + n)  # read now: tokens grow and change every step\n",
        "        if n == 1 and seq.output:\n"
        "            ids.append(seq.output[-1])  # a decode row: the token sampled last\n"
        "        else:\n"
        "            ids += _tokens_between(seq, start, start + n)\n",
    ),
    Mutant(
        "victim_holds_the_most_blocks",
        "43. a victim chosen by size, not age",
        "victim = self.running[-1]",
        "victim = max(reversed(self.running), key=lambda s: s.num_slots)",
    ),
    Mutant(
        "max_tokens_checked_on_decode_rows_only",
        "32. one token past max_tokens (a prompt row's token never ends the request)",
        "if stop or len(seq.output) >= seq.params.max_tokens:",
        "if stop or (item.num_new == 1 and len(seq.output) >= seq.params.max_tokens):",
    ),
    Mutant(
        "chunk_cut_to_whole_blocks",
        "30. admission that stops while the step has room (a chunk cut to whole blocks)",
        "            seq.status = RUNNING\n            self.running.append(seq)\n"
        "            num_new = min(seq.num_tokens - seq.num_computed, budget)\n",
        "            seq.status = RUNNING\n            self.running.append(seq)\n"
        "            num_new = min(seq.num_tokens - seq.num_computed, budget)\n"
        "            if num_new < seq.num_tokens - seq.num_computed:\n"
        "                num_new = max(num_new // self.block_size * self.block_size, 1)\n",
    ),
    Mutant(
        "preempt_keeps_the_victims_blocks",
        "44. a preempted request's blocks kept",
        "        self.running.remove(seq)\n        self.block_manager.free(seq.seq_id)\n        seq.status = WAITING\n",
        "        self.running.remove(seq)\n        seq.status = WAITING\n",
    ),
    Mutant(
        "running_walk_over_a_copy",
        "45. the running walk over a copy of self.running: a victim preempted in the step still given slots",
        "        i = 0\n        while i < len(self.running) and budget > 0:\n            seq = self.running[i]\n",
        "        i = 0\n        for seq in list(self.running):\n            if budget <= 0:\n                break\n",
    ),
    Mutant(
        "preempt_throws_the_reply_away",
        "8. preempt throws the reply away: the request starts again from its prompt",
        "        seq.preemptions += 1\n        self.num_preemptions += 1\n",
        "        seq.output = []\n        seq.generator = None\n        seq.preemptions += 1\n        self.num_preemptions += 1\n",
    ),
    Mutant(
        "whole_prompt_needs_spare_budget",
        "30. without chunks, a prompt that fits what is left of the budget exactly kept waiting",
        "if not self.chunked_prefill and seq.num_tokens > budget:",
        "if not self.chunked_prefill and seq.num_tokens >= budget:",
    ),
]
