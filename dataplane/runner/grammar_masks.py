"""Structured outputs' token masks for a step: filled on a thread while the model runs (they depend only
on tokens already accepted), applied to the logits before sampling."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dataplane.runner.request_state import RunnerRequestState
    from dataplane.scheduler.output import ModelRunnerOutput
    from dataplane.structured.backend import GrammarBackend

log = logging.getLogger(__name__)


class GrammarMasks:
    def __init__(self, structured: GrammarBackend | None, states: dict[str, RunnerRequestState]) -> None:
        self.structured = structured  # compiles and matches grammars of structured-output requests
        self.states = states  # the runner's request states (the matchers live there)
        self._pool: ThreadPoolExecutor | None = None
        self.grammar_seconds = 0.0  # the step's own time on masks: waiting for the fill, applying
        self.grammar_fill_seconds = 0.0  # filling, on the grammar thread (overlapped with the model)

    def begin(self, sampled: list[str]) -> Future | None:
        """Start filling the grammar masks of this step's structured-output rows (None: there are none)."""
        constrained = [i for i, rid in enumerate(sampled) if self.states[rid].params.structured is not None]
        if not constrained:
            return None
        if self.structured is None:
            done: Future = Future()
            done.set_result((None, [], {sampled[i]: "structured outputs are not enabled on this engine"
                                        for i in constrained}))
            return done
        # Allocated here, on the engine thread: from 22 rows up the fill is a parallel torch op, and one
        # run on the mask thread gives that thread an OpenMP pool of its own for good, which throttles
        # every later step's barriers (passing_thread.py): batch-1 decode fell from 47 to 32 tok/s after
        # one 32-row structured step, for the engine's life (SmolLM2 bf16, 2 threads, AMD EPYC).
        bitmask = self.structured.allocate_bitmask(len(sampled))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        return self._pool.submit(self._fill, bitmask, sampled, constrained)

    def _fill(self, bitmask, sampled: list[str], constrained: list[int]) -> tuple[object, list[int], dict[str, str]]:
        """(bitmask, rows it masks, failures): a matcher that cannot be built fails its request.
        Runs no torch op (xgrammar writes the rows itself), so this thread never starts an OpenMP pool."""
        start = time.perf_counter()
        failed: dict[str, str] = {}
        masked = []
        for i in constrained:
            st = self.states[sampled[i]]
            try:
                if st.matcher is None:  # first sampling, or resumed after preemption: replay its outputs
                    st.matcher = self.structured.matcher(st.params.structured, st.token_ids[st.num_prompt_tokens:])
                st.matcher.fill(bitmask, i)
            except ValueError as exc:
                failed[sampled[i]] = str(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - a grammar's failure is its request's, not the batch's
                log.exception("grammar mask failed", extra={"request_id": sampled[i]})
                failed[sampled[i]] = f"{st.params.structured.source}: grammar error: {exc}"
                continue
            masked.append(i)
        self.grammar_fill_seconds += time.perf_counter() - start
        return bitmask, masked, failed

    def finish(self, masks: Future | None, result: ModelRunnerOutput):  # noqa: ANN201
        """A function masking the constrained rows' logits in place, or None."""
        if masks is None:
            return None
        t0 = time.perf_counter()
        bitmask, masked, failed = masks.result()
        self.grammar_seconds += time.perf_counter() - t0
        result.failed_request_ids.update(failed)
        if not masked:
            return None

        def constrain(logits):  # noqa: ANN001, ANN202
            t1 = time.perf_counter()
            self.structured.apply_bitmask(logits, bitmask.to(logits.device, non_blocking=True), masked)
            self.grammar_seconds += time.perf_counter() - t1
        return constrain
