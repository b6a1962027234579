"""Checkpoints: rendering, ageing one level per compression, merging the oldest (checkpoint ageing)."""

from __future__ import annotations

import msgspec
import pytest

from ctxd.engine.checkpoints import (
    SECTION_HEADER,
    ageable,
    merged,
    new_id,
    plan_aging,
    plan_merge,
    render_checkpoint,
    render_section,
    truncation_notice,
)
from ctxd.engine.policy import LEVEL_CAP, LEVEL_RATIO, LEVELS, MIN_TARGET, initial_level, lower, target_tokens
from ctxd.protocol.compression import Checkpoint, ToolUse
from ctxd.tokens import TokenCounter

from ._engine_helpers import NOW

MAX_PROMPT = 6000


def cp(id: str, level: str = "detailed", kind: str = "summary", tokens: int = 1000, seqs=(1, 10), **kw) -> Checkpoint:
    first, last = seqs
    return Checkpoint(id=id, kind=kind, level=level, seq_from=first, seq_to=last,  # type: ignore[arg-type]
                      message_ranges=[(first, last)], summary=f"summary of {id}", tokens=tokens,
                      original_tokens=tokens * 3, created_at=NOW, compression_number=1, summarizer="test", **kw)


def age(checkpoints: list[Checkpoint]) -> list[Checkpoint]:
    """Apply plan_aging as the service does (the re-summary is simulated by the target)."""
    steps = {s.checkpoint_id: s for s in plan_aging(checkpoints, MAX_PROMPT)}
    out = []
    for c in checkpoints:
        step = steps.get(c.id)
        if step is None:
            out.append(c)
        else:
            out.append(msgspec.structs.replace(c, level=step.to_level, tokens=step.target_tokens,
                                               compression_count=c.compression_count + 1))
    return out


# --- policy: levels and targets -------------------------------------------------------


def test_levels_and_lower():
    assert LEVELS == ("ultra", "compact", "moderate", "detailed")
    assert [lower(x) for x in ("detailed", "moderate", "compact", "ultra")] == ["moderate", "compact", "ultra", "ultra"]


def test_ageing_ratios():
    # a new checkpoint 50-70% compressed; ageing to 60% then 50%; merged to 40%
    assert LEVEL_RATIO["moderate"] == 0.60 and LEVEL_RATIO["compact"] == 0.50 and LEVEL_RATIO["ultra"] == 0.40
    assert 0.30 <= LEVEL_RATIO["detailed"] <= 0.50


def test_target_tokens():
    assert target_tokens("moderate", 1000, 100_000) == 600
    assert target_tokens("compact", 1000, 100_000) == 500
    # capped by a share of the largest prompt (checkpoint ageing's 8K figures ~2000/1200/800/400)
    assert target_tokens("detailed", 100_000, 8000) == int(8000 * LEVEL_CAP["detailed"]) == 2000
    assert target_tokens("moderate", 100_000, 8000) == 1200
    assert target_tokens("compact", 100_000, 8000) == 640
    assert target_tokens("ultra", 100_000, 8000) == 400
    assert target_tokens("ultra", 10, 8000) == MIN_TARGET


@pytest.mark.parametrize("tokens, level", [(0, "detailed"), (2000, "detailed"), (2001, "moderate"),
                                           (3000, "moderate"), (3001, "compact")])
def test_initial_level_bounds(tokens, level):
    assert initial_level(tokens, 6000) == level


# --- rendering ------------------------------------------------------------------------


def test_render_checkpoint_titles():
    assert render_checkpoint(cp("a")) == "### Messages 1-10 (detailed summary)\nsummary of a"
    assert render_checkpoint(cp("b", level="ultra")).startswith("### Messages 1-10 (ultra summary)")
    assert render_checkpoint(cp("c", kind="truncated", level="compact")).startswith("### Messages 1-10 (omitted)")
    assert render_checkpoint(cp("d", kind="folded", level="compact")).startswith(
        "### Earlier user messages 1-10 (folded out of the conversation to fit the window)")
    padded = msgspec.structs.replace(cp("e"), summary="\n  text \n")
    assert render_checkpoint(padded).endswith("\ntext")


def test_render_section():
    assert render_section([]) is None
    section = render_section([cp("a", seqs=(1, 5)), cp("b", seqs=(6, 9))])
    assert section.startswith(SECTION_HEADER)
    assert section.index("Messages 1-5") < section.index("Messages 6-9")  # oldest first


def test_truncation_notice():
    text = truncation_notice(3, 9, 7, 1234, [f"f{i}.py" for i in range(12)])
    assert "7 earlier messages (1234 tokens)" in text and "f9.py" in text and "f10.py" not in text
    assert "Files" not in truncation_notice(3, 9, 7, 1234, [])


# --- ageing ---------------------------------------------------------------------------


def test_ageable():
    assert ageable(cp("a", "detailed")) and ageable(cp("b", "moderate"))
    assert not ageable(cp("c", "compact")) and not ageable(cp("d", "ultra"))
    assert not ageable(cp("e", "detailed", kind="folded"))
    assert not ageable(cp("f", "detailed", kind="truncated"))


def test_one_level_down_per_compression():
    first = cp("first", tokens=1000)
    older = [first]
    history = []
    for _ in range(4):
        older = age(older)
        history.append((older[0].level, older[0].tokens))
    assert history == [("moderate", 600), ("compact", 300), ("compact", 300), ("compact", 300)]


def test_plan_aging_steps_and_targets():
    checkpoints = [cp("a", "detailed", tokens=2000), cp("b", "moderate", tokens=1000), cp("c", "compact"),
                   cp("d", "ultra"), cp("e", "compact", kind="truncated"), cp("f", "compact", kind="folded")]
    steps = plan_aging(checkpoints, MAX_PROMPT)
    assert [(s.checkpoint_id, s.to_level, s.target_tokens) for s in steps] == [
        ("a", "moderate", target_tokens("moderate", 2000, MAX_PROMPT)),
        ("b", "compact", target_tokens("compact", 1000, MAX_PROMPT)),
    ]
    assert all(s.target_tokens < c.tokens for s, c in zip(steps, checkpoints))


def test_folded_and_truncated_never_age():
    checkpoints = [cp("t", "compact", kind="truncated"), cp("f", "compact", kind="folded")]
    assert plan_aging(checkpoints, MAX_PROMPT) == []
    assert age(age(checkpoints)) == checkpoints


def test_three_compressions_age_the_older_ones():
    """Each compression: a new detailed checkpoint, the older ones one level down."""
    checkpoints: list[Checkpoint] = []
    for n in range(1, 4):
        checkpoints = age(checkpoints) + [cp(f"c{n}", "detailed", tokens=2000, seqs=(n * 10, n * 10 + 9))]
    assert [c.level for c in checkpoints] == ["compact", "moderate", "detailed"]
    # oldest checkpoints are the most compressed
    assert [c.tokens for c in checkpoints] == sorted(c.tokens for c in checkpoints)


# --- merging --------------------------------------------------------------------------


def test_plan_merge_only_beyond_max_checkpoints():
    summaries = [cp(f"c{i}", "compact", tokens=100 * (i + 1), seqs=(i * 10, i * 10 + 9)) for i in range(4)]
    assert plan_merge(summaries, 4, MAX_PROMPT) is None
    five = summaries + [cp("c4", seqs=(40, 49))]
    step = plan_merge(five, 4, MAX_PROMPT)
    assert step.checkpoint_ids == ("c0", "c1")
    assert step.target_tokens == target_tokens("ultra", 100 + 200, MAX_PROMPT)


def test_plan_merge_ignores_folded_and_truncated():
    others = [cp("f", kind="folded", level="compact"), cp("t", kind="truncated", level="compact")]
    summaries = [cp(f"c{i}", seqs=(i * 10, i * 10 + 9)) for i in range(3)]
    assert plan_merge(others + summaries, 2, MAX_PROMPT).checkpoint_ids == ("c0", "c1")
    assert plan_merge(others + summaries[:2], 2, MAX_PROMPT) is None


def test_merged_joins_ranges_and_facts():
    first = cp("a", "compact", tokens=300, seqs=(1, 10), compression_count=3,
               key_decisions=["Use JWT", "Use bcrypt"], files_modified=["src/a.py", "src/b.py"],
               tools_used=[ToolUse("Write", 2, ["Wrote src/a.py"]), ToolUse("Bash", 1)],
               next_steps=["write tests"], errors=["E0", "E1", "E2", "E3"])
    second = cp("b", "moderate", tokens=500, seqs=(11, 20), compression_count=2,
                key_decisions=["Use JWT", "Cookies are httpOnly"], files_modified=["src/b.py", "src/c.py"],
                tools_used=[ToolUse("Write", 3, ["Wrote src/c.py"]), ToolUse("Read", 4)],
                next_steps=[], errors=["E4", "E5", "E6", "E7", "E8"])
    m = merged(first, second, "both", 120, "llm", "2026-02-01T00:00:00Z", 7)
    assert m.kind == "summary" and m.level == "ultra"
    assert (m.seq_from, m.seq_to) == (1, 20)
    assert m.message_seqs == list(range(1, 21))
    assert m.original_tokens == first.original_tokens + second.original_tokens
    assert m.tokens == 120 and m.summary == "both"
    assert m.compression_count == 4
    assert m.merged_from == ["a", "b"]
    assert m.compression_number == 7 and m.created_at == m.compressed_at == "2026-02-01T00:00:00Z"
    assert m.key_decisions == ["Use JWT", "Use bcrypt", "Cookies are httpOnly"]
    assert m.files_modified == ["src/a.py", "src/b.py", "src/c.py"]
    tools = {t.tool: t for t in m.tools_used}
    assert set(tools) == {"Write", "Bash", "Read"}
    assert tools["Write"].count == 5  # both checkpoints' calls
    assert tools["Write"].notable_uses == ["Wrote src/a.py", "Wrote src/c.py"]
    assert tools["Read"].count == 4
    assert m.next_steps == ["write tests"]  # the newer ones, or else the older ones
    assert m.errors == ["E1", "E2", "E3", "E4", "E5", "E6", "E7", "E8"]  # the newest ERRORS_KEPT
    assert m.id not in ("a", "b")


def test_merged_inputs_are_untouched():
    first = cp("a", tools_used=[ToolUse("Write", 2, ["x"])])
    second = cp("b", tools_used=[ToolUse("Write", 3, ["y"])], seqs=(11, 20))
    merged(first, second, "s", 1, "llm", NOW, 2)
    assert first.tools_used == [ToolUse("Write", 2, ["x"])]
    assert second.tools_used == [ToolUse("Write", 3, ["y"])]


def test_many_compressions_stay_bounded():
    """Ageing plus merging keep the checkpoint count and size bounded ("3-5+ compressions" and on)."""
    checkpoints: list[Checkpoint] = []
    for n in range(1, 30):
        checkpoints = age(checkpoints) + [cp(f"c{n}", "detailed", tokens=2000, seqs=(n * 10, n * 10 + 9))]
        while (step := plan_merge(checkpoints, 4, MAX_PROMPT)) is not None:
            a = next(c for c in checkpoints if c.id == step.checkpoint_ids[0])
            b = next(c for c in checkpoints if c.id == step.checkpoint_ids[1])
            m = merged(a, b, "merged", step.target_tokens, "llm", NOW, n)
            index = checkpoints.index(a)
            rest = [c for c in checkpoints if c.id not in step.checkpoint_ids]
            rest.insert(index, m)
            checkpoints = rest
        assert len(checkpoints) <= 4
    assert checkpoints[0].seq_from == 10 and checkpoints[-1].seq_to == 299
    assert sum(c.tokens for c in checkpoints) < 2000 + 1200 + 800 + 400


def test_with_a_share_only_the_oldest_age_and_only_as_far_as_needed():
    checkpoints = [cp("a", tokens=1000), cp("b", tokens=1000), cp("c", tokens=1000)]
    # Within the share: nothing ages.
    assert plan_aging(checkpoints, MAX_PROMPT, share=3000 / MAX_PROMPT) == []
    # A little over: the oldest alone goes a level down.
    steps = plan_aging(checkpoints, MAX_PROMPT, share=2900 / MAX_PROMPT)
    assert [s.checkpoint_id for s in steps] == ["a"] and steps[0].to_level == "moderate"
    # Far over: all of them.
    assert [s.checkpoint_id for s in plan_aging(checkpoints, MAX_PROMPT, share=0.0)] == ["a", "b", "c"]


def test_plan_merge_with_a_share_keeps_what_the_share_has_room_for():
    summaries = [cp(f"c{i}", "compact", tokens=100 * (i + 1), seqs=(i * 10, i * 10 + 9)) for i in range(5)]
    others = sum(c.tokens for c in summaries[2:])
    # Room in the share for both: the merge only drops a title, it does not forget.
    step = plan_merge(summaries, 4, MAX_PROMPT, share=(others + 1000) / MAX_PROMPT)
    assert step.target_tokens == 100 + 200 - 16
    # Little room: what the share leaves, never below the ultra size.
    step = plan_merge(summaries, 4, MAX_PROMPT, share=(others + 200) / MAX_PROMPT)
    assert step.target_tokens == max(200, target_tokens("ultra", 300, MAX_PROMPT))
    step = plan_merge(summaries, 4, MAX_PROMPT, share=others / MAX_PROMPT)
    assert step.target_tokens == target_tokens("ultra", 300, MAX_PROMPT)


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_a_checkpoint_id_costs_the_same_tokens_whatever_its_draw(encoding):
    """Prompts name checkpoint ids (the folded notice's ``checkpoint/expand <id>``): an id
    whose token count depends on its random draw made the same conversation compress
    differently from one run to the next."""
    counter = TokenCounter.for_encoding(encoding)
    ids = {new_id() for _ in range(300)}
    assert len(ids) == 300
    assert len({counter.count(f"checkpoint/expand {i} or session/history") for i in ids}) == 1
