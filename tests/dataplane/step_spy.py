"""What the runner was given per step, recorded: (requests, tokens) of each SchedulerOutput."""

from __future__ import annotations


def spy_steps(llm) -> list[tuple[int, int]]:
    """Wrap `llm.core.runner.execute`; the list fills as the engine steps."""
    seen: list[tuple[int, int]] = []
    execute = llm.core.runner.execute

    def spy(out):
        seen.append((len(out.num_scheduled_tokens), out.total_num_scheduled_tokens))
        return execute(out)

    llm.core.runner.execute = spy
    return seen
