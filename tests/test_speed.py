"""The LLM's speed here, learned from its replies, and answers sized to it: a fake Ollama
as slow as a small CPU and as fast as a GPU, reporting its token counts and durations."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rag.answer.service import AnswerService
from rag.index.note_index import NoteIndex
from rag.llm import OllamaChat
from rag.speed import FILE, SpeedBook, Usage, base_tokens

from conftest import index_samples
from fakes.ollama import FakeOllama, fake_tokens

QUESTION = "番茄炒蛋怎么做才不酸？"


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory, use_embedder):
    return index_samples(tmp_path_factory.mktemp("speed"), use_embedder, rerank={"kind": "none"})


@pytest.fixture(autouse=True)
def no_speed_learned_yet(request):
    """Each test starts as a new install: nothing learned about the LLM."""
    if "sample_index" in request.fixturenames:
        (request.getfixturevalue("sample_index").state_dir / FILE).unlink(missing_ok=True)


def service(settings, url, use_embedder, **answer):
    s = settings.model_copy(update={
        "ollama": settings.ollama.model_copy(update={"host": url, "timeout": 60.0}),
        "answer": settings.answer.model_copy(update=answer)})
    index = NoteIndex.open(s, embedder=use_embedder)
    return AnswerService(s, index, chat=OllamaChat(s.ollama)), index


def ask(svc, question=QUESTION):
    return asyncio.run(svc.ask(question, "local"))


@pytest.mark.slow
def test_a_slow_machine_is_measured_and_the_evidence_cut_to_the_first_token_budget(sample_index, use_embedder):
    read, write = 3000.0, 400.0  # tokens a second: a small CPU, ten times sped up for the test
    budget = 0.8
    with FakeOllama(speed=(read, write)) as ollama:
        svc, index = service(sample_index, ollama.url, use_embedder, first_token_budget=budget)
        try:
            ollama.reply("先把鸡蛋炒好盛出[1]，", "再加一小勺糖[1]。")
            first = ask(svc)  # nothing measured yet: measured first, with a short reply
            assert "speed measured first" in first.trace.budget and len(ollama.probes()) == 1
            speed = svc.speeds.get("qwen2.5:7b-instruct")
            assert speed.read_tps == pytest.approx(read, rel=0.25) and speed.write_tps == pytest.approx(write, rel=0.4)
            assert "evidence cut to" in first.trace.budget  # sized to it at once
            # the estimate learned how the model counts tokens: off by little on the next prompt
            reported, estimated = first.usage["prompt_tokens"], first.usage["prompt_tokens_estimated"]
            assert reported == fake_tokens("\n".join(m["content"] for m in ollama.chats()[-1]["messages"]))

            for _ in range(3):  # more replies: the running estimate settles
                ollama.reply("加一小勺糖[1]。")
                answer = ask(svc)
            assert "evidence cut to" in answer.trace.budget and "first_token_budget" in answer.trace.budget
            assert len(ollama.probes()) == 1  # measured once
            # what the model had to read fits the budget at its speed (the fake sleeps exactly that long)
            assert answer.usage["prompt_tokens"] / read <= budget
            assert answer.usage["prompt_tokens_estimated"] == pytest.approx(answer.usage["prompt_tokens"], rel=0.15)
            assert sum(len(t) for t in answer.trace.evidence.values()) < svc.settings.answer.total_chars
            options = ollama.chats()[-1]["options"]
            assert 64 <= options["num_predict"] <= 1024  # the answer fits ollama.timeout at its writing speed
        finally:
            svc.close()
            index.close()
        assert estimated > 0


@pytest.mark.slow
def test_the_evidence_is_never_cut_below_the_best_passage_whole(sample_index, use_embedder):
    """A machine as slow as 12 tokens a second reading (ten times sped up: 120), against a 3 s
    budget: the best passage alone takes longer than the budget to read. It is sent whole and
    the first token comes later (it used to be cut to 160 characters, and the model guessed)."""
    with FakeOllama(speed=(120.0, 30.0)) as ollama:
        svc, index = service(sample_index, ollama.url, use_embedder, first_token_budget=3.0, min_evidence_chars=0)
        svc.settings = svc.settings.model_copy(update={"ollama": svc.settings.ollama.model_copy(update={"timeout": 40.0})})
        svc.chat = OllamaChat(svc.settings.ollama)
        try:
            ollama.reply("先把鸡蛋炒好盛出[1]。")
            answer = ask(svc)
            assert answer.trace.outcome == "llm", answer.trace.decision  # the first question does not time out
            assert len(ollama.probes()) == 1
            blocks = answer.trace.evidence
            assert len(blocks) == 1 and "the first token comes after" in answer.trace.budget
            text = blocks["1"].split("\n", 1)[1]
            assert "一定要先把鸡蛋炒好盛出" in text and not text.endswith("…")  # the section whole
        finally:
            svc.close()
            index.close()


def test_however_slow_the_model_the_evidence_is_what_a_plain_answer_needs(settings_factory):
    """A probe at load 6.5 left answers one 409-character passage of 8,000, and plain questions
    were withdrawn or answered by pasting the note. The first-token budget is a target: below
    ``answer.min_evidence_chars`` the evidence is not cut, the first token comes later."""
    from rag.answer.sizing import fit, plan_for
    from rag.model import Hit
    from rag.speed import Speed

    def hit(n: int, text: str) -> Hit:
        return Hit(point_id=f"p{n}", note_id=f"n{n}", user_id="u", title=f"笔记{n}", notebook="N", heading="H",
                   url=f"http://l/note/n{n}", text=text, chunk_index=0, char_start=0, char_end=len(text),
                   score=1.0 / (n + 1))

    top = [hit(0, "番茄炒蛋先炒蛋，盛出备用。" * 30)] + [hit(n, f"番茄炒蛋第{n}种做法：加糖，出锅前放葱。" * 40)
                                                          for n in range(1, 6)]
    settings = settings_factory(answer={"min_evidence_chars": 2000}, ollama={"timeout": 300})
    slow = Speed(read_tps=13.0, write_tps=6.0, samples=3)
    plan = plan_for(settings, "m", slow, QUESTION, top, elapsed=1.0)
    blocks, _, _ = fit(settings, QUESTION, top, plan)
    chars = sum(len(b.text) for b in blocks)
    assert chars >= 2000 * 0.9 and len(blocks) > 1, plan.note  # never the best passage alone
    assert not plan.too_slow and "the first token comes after" in plan.note
    assert "answer.min_evidence_chars (2000)" in plan.note
    quick = Speed(read_tps=5000.0, write_tps=50.0, samples=3)  # a fast machine reads as much as is configured
    plan = plan_for(settings, "m", quick, QUESTION, top, elapsed=1.0)
    assert sum(len(b.text) for b in fit(settings, QUESTION, top, plan)[0]) > 4000
    # where even the floor could not be read and answered within ollama.timeout, the best passage whole
    tight = settings_factory(answer={"min_evidence_chars": 2000, "first_token_budget": 30}, ollama={"timeout": 60})
    plan = plan_for(tight, "m", Speed(read_tps=18.0, write_tps=6.0, samples=3), QUESTION, top, elapsed=1.0)
    blocks, _, _ = fit(tight, QUESTION, top, plan)
    assert not plan.too_slow and len(blocks) == 1 and blocks[0].text == top[0].text, plan.note


@pytest.mark.slow
def test_a_model_too_slow_to_read_the_best_passage_within_the_timeout_is_not_asked(sample_index, use_embedder):
    with FakeOllama(speed=(60.0, 30.0)) as ollama:  # the best passage alone: ~20 s, against a 12 s timeout
        svc, index = service(sample_index, ollama.url, use_embedder, first_token_budget=3.0)
        svc.settings = svc.settings.model_copy(update={"ollama": svc.settings.ollama.model_copy(update={"timeout": 12.0})})
        svc.chat = OllamaChat(svc.settings.ollama)
        try:
            answer = ask(svc)
            assert len(ollama.probes()) == 1 and ollama.chats() == []  # measured, then not asked
            assert answer.trace.outcome == "fallback" and "would not fit ollama.timeout" in answer.trace.decision
            assert answer.answer.startswith("[1] 番茄炒蛋") and answer.notice.startswith("（这台机器上的语言模型太慢")
        finally:
            svc.close()
            index.close()


@pytest.mark.slow
def test_a_machine_that_got_slower_learns_from_its_timeouts_and_then_answers(sample_index, use_embedder):
    """The speed measured when the machine was idle; now it reads ten times slower and the
    first prompt (sized to the old speed) takes longer than ollama.timeout: the cut-short reply
    teaches the speed, the next prompts are smaller, and an answer comes."""
    read = 400.0
    with FakeOllama(speed=(read, 2000.0)) as ollama:
        svc, index = service(sample_index, ollama.url, use_embedder, first_token_budget=4.0)
        svc.settings = svc.settings.model_copy(update={"ollama": svc.settings.ollama.model_copy(update={"timeout": 6.0})})
        svc.chat = OllamaChat(svc.settings.ollama)
        svc.speeds.observe("qwen2.5:7b-instruct", Usage(4000, 1.0, 400, 0.2), "字" * 4000)  # once, when idle
        try:
            outcomes, prompts = [], []
            for _ in range(8):
                ollama.reply("先把鸡蛋炒好盛出[1]。")
                answer = ask(svc)
                outcomes.append(answer.trace.outcome)
                prompts.append(answer.usage.get("prompt_tokens_estimated") or svc.speeds.get("qwen2.5:7b-instruct").tokens(
                    "\n".join(m["content"] for m in ollama.chats()[-1]["messages"])))
                if answer.trace.outcome == "llm":
                    break
            assert outcomes[0] == "fallback" and outcomes[-1] == "llm", outcomes
            assert prompts[-1] < prompts[0]
            assert svc.speeds.get("qwen2.5:7b-instruct").read_tps <= read * 1.3
            assert ollama.probes() == []  # a speed was known: nothing to measure first
        finally:
            svc.close()
            index.close()


def test_a_fast_machine_gets_all_the_evidence(sample_index, use_embedder):
    with FakeOllama(speed=(20000.0, 500.0)) as ollama:  # a GPU
        svc, index = service(sample_index, ollama.url, use_embedder, first_token_budget=4.0)
        try:
            for _ in range(2):
                ollama.reply("加一小勺糖[1]。")
                answer = ask(svc)
            assert answer.trace.budget.startswith("evidence as configured")
        finally:
            svc.close()
            index.close()


@pytest.mark.slow
def test_the_speed_is_kept_for_the_next_start_and_shown_by_status(sample_index, use_embedder, capsys):
    from bot.cli import main

    with FakeOllama(speed=(500.0, 60.0)) as ollama:
        svc, index = service(sample_index, ollama.url, use_embedder)
        try:
            ollama.reply("先把鸡蛋炒好盛出[1]，", "再加一小勺糖压住酸味[1]。")
            ask(svc)
        finally:
            svc.close()
            index.close()
    book = SpeedBook(sample_index.state_dir / FILE)  # a new process reads what was learned
    assert book.get("qwen2.5:7b-instruct").read_tps == pytest.approx(500.0, rel=0.3)
    cfg = sample_index.state_dir.parent / "c.yaml"
    cfg.write_text(f"source: {{kind: files, path: '{sample_index.source.path}'}}\nstate_dir: '{sample_index.state_dir}'\n")
    assert main(["--config", str(cfg), "status"]) == 0
    out = capsys.readouterr().out
    assert "llm:      qwen2.5:7b-instruct here:" in out and "tok/s reading" in out and "tok/s writing" in out


def test_the_token_estimate_follows_the_scripts_and_learns_from_counts(tmp_path):
    assert base_tokens("番茄炒蛋") == pytest.approx(4 * 0.7)
    assert base_tokens("retry_count") == pytest.approx(11 * 0.28)
    book = SpeedBook(tmp_path / FILE)
    text = "番茄炒蛋要先炒蛋" * 20
    book.observe("m", Usage(prompt_tokens=len(text), prompt_seconds=1.0, output_tokens=20, output_seconds=2.0), text)
    speed = book.get("m")
    assert speed.tokens(text) == pytest.approx(len(text), rel=0.01)  # calibrated: 1 token per character here
    assert speed.read_tps == pytest.approx(len(text)) and speed.write_tps == pytest.approx(10.0)
    book.observe("m", Usage(), text)  # a reply without counts teaches nothing
    assert book.get("m").samples == 1


def test_a_reply_cut_short_before_its_first_token_is_a_bound_that_the_next_measurement_replaces(tmp_path):
    """1,000 prompt tokens and no first token within 2 s: the model reads under 500 tok/s,
    not at 500. A later reply measuring 100 tok/s is the speed (blending it into the bound
    gave 380, and the next prompts were sized for a model four times as fast)."""
    book = SpeedBook(tmp_path / FILE)
    book.cut_short("m", 1000, 2.0, None)
    assert book.get("m").read_tps == pytest.approx(500.0) and book.get("m").bound
    assert "under 500 tok/s reading" in book.get("m").describe("m")
    book.cut_short("m", 1200, 2.0, None)  # a looser bound says nothing new
    assert book.get("m").read_tps == pytest.approx(500.0)
    book.cut_short("m", 600, 2.0, None)  # a tighter one lowers it
    assert book.get("m").read_tps == pytest.approx(300.0)
    book.observe("m", Usage(prompt_tokens=200, prompt_seconds=2.0, output_tokens=20, output_seconds=2.0), "x" * 700)
    book.flush()  # (saved off the caller's thread)
    again = SpeedBook(tmp_path / FILE).get("m")  # as a new process reads it
    assert again.read_tps == pytest.approx(100.0) and not again.bound
    book.observe("m", Usage(prompt_tokens=200, prompt_seconds=1.0), "x" * 700)  # measurements blend
    assert book.get("m").read_tps == pytest.approx(0.7 * 100 + 0.3 * 200)
    book.cut_short("m", 1000, 2.0, None)  # a bound above a measured speed changes nothing
    assert book.get("m").read_tps == pytest.approx(130.0) and not book.get("m").bound


def test_what_a_measured_speed_means_for_the_person_waiting():
    from rag.speed import Speed, meaning, model_size

    assert model_size("qwen2.5-coder:1.5b-instruct") == 1.5 and model_size("qwen2.5:7b-instruct") == 7.0
    assert model_size("llama3") is None
    line = meaning("qwen2.5-coder:1.5b-instruct", Speed(read_tps=25.0), 30.0, 800, "the answers' prompts")
    assert line == ("~32 s to a first token for a prompt of ~800 tokens (the answers' prompts); a 3B would take "
                    "~64 s; the largest that reads it within answer.first_token_budget (30 s) is ~0.5B")
    assert "within" not in meaning("qwen2.5:7b-instruct", Speed(read_tps=200.0), 30.0, 800, "x").split(";")[0]
    assert "even for a 0.5B" in meaning("qwen2.5-coder:0.5b-instruct", Speed(read_tps=10.0), 30.0, 800, "x")
    assert meaning("m", Speed(), 30.0, 800, "x") is None
    assert meaning("qwen2.5-coder:1.5b-instruct", Speed(read_tps=25.0, bound=True), 30.0, 800, "x").startswith(
        "over ~32 s")


def test_the_reading_speed_follows_the_replies_both_ways(tmp_path):
    """`doctor` probed 13 tok/s while the box was at load 6.5; the speed used was the lower of the
    probe and the replies, so every later answer read one passage. A reply measures the speed
    too (what it read that was not cached, in the time it took): quiet again, the speed rises;
    busy again, it falls."""
    book = SpeedBook(tmp_path / FILE)
    text = "番茄炒蛋要先炒蛋" * 20
    book.observe("m", Usage(prompt_tokens=260, prompt_seconds=20.0, output_tokens=12, output_seconds=2.0), text,
                 probe=True)  # under load
    assert book.get("m").read_tps == pytest.approx(13.0) and book.get("m").probe_tps == pytest.approx(13.0)
    for _ in range(6):  # the box quiet again: 1,200 prompt tokens, 200 of them cached, read in 20 s
        book.observe("m", Usage(prompt_tokens=1200, prompt_seconds=20.0, output_tokens=50, output_seconds=8.0,
                                cached_tokens=200), text, answer=True)
    assert book.get("m").read_tps > 40  # on its way to 50, not held at the probe's 13
    for _ in range(6):  # busy again
        book.observe("m", Usage(prompt_tokens=1200, prompt_seconds=80.0, cached_tokens=200), text)
    assert book.get("m").read_tps < 20  # on its way to 12.5
    book.flush()
    assert SpeedBook(tmp_path / FILE).get("m").read_tps == pytest.approx(book.get("m").read_tps)


def test_a_reply_is_timed_by_what_it_read_and_not_by_what_the_cache_held(tmp_path):
    """3,000 prompt tokens counted, 2,500 of them from the cache, 10 s of reading: 50 tok/s, not 300."""
    book = SpeedBook(tmp_path / FILE)
    book.observe("m", Usage(prompt_tokens=3000, prompt_seconds=10.0, cached_tokens=2500), "字" * 3000)
    assert book.get("m").read_tps == pytest.approx(50.0) and book.get("m").cache_counts
    # a server that says what it cached and says nothing: nothing was (Ollama leaves the count out then)
    book.observe("m", Usage(prompt_tokens=500, prompt_seconds=10.0), "字" * 500, shared_text="字" * 300)
    assert book.get("m").read_tps == pytest.approx(0.7 * 50 + 0.3 * 50)
    # one that never says (an older Ollama): the part the prompts share is taken as cached, which
    # can only read the speed lower than it is, never higher
    old = SpeedBook(None)
    old.observe("m", Usage(prompt_tokens=600, prompt_seconds=10.0), "字" * 600, shared_text="字" * 200)
    shared = old.get("m").tokens("字" * 200)
    assert old.get("m").read_tps == pytest.approx((600 - shared) / 10.0) and not old.get("m").cache_counts
    old.observe("m", Usage(prompt_tokens=600, prompt_seconds=10.0), "字" * 600, probe=True, shared_text="字" * 200)
    assert old.get("m").probe_tps == pytest.approx(60.0)  # the probe's prompt: nothing of it can be cached


def test_a_speed_saved_by_an_earlier_version_still_reads(tmp_path):
    (tmp_path / FILE).write_text('{"m": {"read_tps": 13.0, "write_tps": 8.0, "samples": 3, "probe_tps": 13.0, '
                                 '"replies_tps": 250.0}}')
    old = SpeedBook(tmp_path / FILE).get("m")
    assert old.read_tps == 13.0 and old.write_tps == 8.0 and old.probe_tps == 13.0
    old.read(50.0)
    assert old.read_tps == pytest.approx(0.7 * 13 + 0.3 * 50)  # and the replies lift it from there


def test_ollamas_cached_count_reaches_the_speed_from_the_wire(tmp_path, settings_factory):
    """The ``ollama`` client drops ``prompt_eval_cached_count`` from the reply's last line: the
    chat reads it itself."""
    with FakeOllama(cache=True) as ollama:
        settings = settings_factory(ollama={"host": ollama.url})
        chat = OllamaChat(settings.ollama)
        prompt = [{"role": "system", "content": "规则" * 100}, {"role": "user", "content": "番茄炒蛋怎么做？"}]

        async def twice():
            first, second = Usage(), Usage()
            for usage in (first, second):
                ollama.reply("先炒蛋。")
                assert await chat.complete(prompt, usage=usage) == "先炒蛋。"
            return first, second

        first, second = asyncio.run(twice())
        text = "\n".join(m["content"] for m in prompt)
        assert first.cached_tokens is None and first.prompt_tokens == fake_tokens(text)  # nothing cached: left out
        assert second.cached_tokens == fake_tokens(text) and second.prompt_tokens == fake_tokens(text)


@pytest.mark.slow
def test_answers_starved_by_a_probe_under_load_get_their_evidence_back(sample_index, use_embedder):
    """The probe ran while the box was busy (a tenth of the speed it reads at now): the first
    answers read what a plain answer needs and no more; their replies show the real speed (the
    server's prompt cache told apart), and the answers after them read all the evidence."""
    read = 3000.0
    with FakeOllama(speed=(read, 2000.0), cache=True) as ollama:
        svc, index = service(sample_index, ollama.url, use_embedder, first_token_budget=1.0)
        model = "qwen2.5:7b-instruct"
        svc.speeds.observe(model, Usage(prompt_tokens=300, prompt_seconds=1.0, output_tokens=12, output_seconds=0.1),
                           "字" * 300, probe=True)
        try:
            budgets, sizes = [], []
            for _ in range(7):
                ollama.reply("加一小勺糖[1]。")
                answer = ask(svc)
                budgets.append(answer.trace.budget)
                sizes.append(sum(len(t) for t in answer.trace.evidence.values()))
            assert "evidence cut to" in budgets[0] and sizes[-1] > sizes[0], (sizes, budgets)
            assert svc.speeds.get(model).read_tps == pytest.approx(read, rel=0.35)
            assert svc.speeds.get(model).read_tps <= read * 1.05  # the cached instructions fool nothing
            assert ollama.probes() == []
        finally:
            svc.close()
            index.close()


@pytest.mark.slow
@pytest.mark.parametrize("cached_count", [True, False], ids=["ollama", "an older ollama"])
def test_a_prompt_cache_does_not_fool_the_probe(sample_index, use_embedder, cached_count):
    """The probe came after other requests had warmed the server's prompt cache with the same
    instructions: it read 174 tok/s of a model reading 60, and the first answers were sized for
    three times the evidence. The probe's prompt now starts with something new each time. The
    answers' own replies are not fooled either: by Ollama's count of what it had cached, or, from
    a server that gives none, by taking their shared instructions as cached."""
    read = 3000.0
    with FakeOllama(speed=(read, 2000.0), cache=True, cached_count=cached_count) as ollama:
        svc, index = service(sample_index, ollama.url, use_embedder)
        try:
            ollama.reply("加一小勺糖[1]。")
            ask(svc)  # another install, say: its answer is in the cache now
        finally:
            svc.close()
            index.close()
        (sample_index.state_dir / FILE).unlink()  # this install: nothing learned yet
        svc, index = service(sample_index, ollama.url, use_embedder)
        try:
            for _ in range(4):
                ollama.reply("加一小勺糖[1]。")
                answer = ask(svc)
            speed = svc.speeds.get("qwen2.5:7b-instruct")
            assert speed.probe_tps == pytest.approx(read, rel=0.05) and len(ollama.probes()) == 2
            # the answers share their instructions, which were cached: told apart, the speed is what it reads
            assert read * 0.8 <= speed.read_tps <= read * 1.05
            assert answer.usage["prompt_tokens"] > 0
        finally:
            svc.close()
            index.close()


@pytest.mark.slow
def test_doctor_on_a_fresh_install_measures_the_llm_and_says_what_answers_will_cost(sample_index, capsys):
    """`doctor` after the first `index`, before any question (the README's order): it measured
    the speed on one event loop and then another, and said "Event loop is closed"."""
    from bot.cli import main

    with FakeOllama(speed=(3000.0, 2000.0), cache=True) as ollama:
        cfg = sample_index.state_dir.parent / "doctor.yaml"
        cfg.write_text(f"source: {{kind: files, path: '{sample_index.source.path}'}}\n"
                       f"state_dir: '{sample_index.state_dir}'\nollama: {{host: '{ollama.url}'}}\n"
                       "rerank: {kind: none}\n")
        code = main(["--config", str(cfg), "doctor"])
        out = capsys.readouterr().out
        assert code == 0, out
        line = next(x for x in out.splitlines() if "ollama" in x)
        assert line.startswith("ok   ollama") and "tok/s reading" in line, line
        assert "answers here read ~7,200 characters of evidence (all the answer settings allow)" in line, line
        assert "measured now at load" in line and "every answer measures it again" in line
        assert len(ollama.probes()) == 1
        assert SpeedBook(sample_index.state_dir / FILE).get("qwen2.5:7b-instruct").probe_tps == pytest.approx(
            3000.0, rel=0.05)
        assert main(["--config", str(cfg), "doctor"]) == 0  # measured once: the next doctor reads it
        assert len(ollama.probes()) == 1 and "ok   ollama" in capsys.readouterr().out
        assert ollama.write_probes() == []  # the measuring reply was long enough to time the writing


def test_a_measuring_reply_too_short_to_time_the_writing_is_followed_by_one_that_is_not(tmp_path, settings_factory):
    """The real 1.5B answers the measuring prompt with its 6-token refusal: the reading was
    timed, the writing not, and the first answer after `doctor` had no length cap. One more
    short reply that cannot be short times the writing."""
    import asyncio

    from rag.answer.sizing import measure_speed
    from rag.llm import OllamaChat

    with FakeOllama(speed=(3000.0, 400.0)) as ollama:
        ollama.probe_reply = "没有。"  # fewer tokens than a speed is learnt from
        settings = settings_factory(ollama={"host": ollama.url})
        book = SpeedBook(tmp_path / FILE)
        line = asyncio.run(measure_speed(OllamaChat(settings.ollama), book, settings))
        speed = book.get(settings.ollama.model)
        assert len(ollama.probes()) == 1 and len(ollama.write_probes()) == 1
        assert speed.read_tps and speed.write_tps == pytest.approx(400.0, rel=0.2), line
        assert "tok/s writing" in line
        asyncio.run(measure_speed(OllamaChat(settings.ollama), book, settings))  # known now: not asked again
        assert len(ollama.write_probes()) == 1


def test_what_is_learned_is_saved_off_the_callers_thread(tmp_path, monkeypatch):
    """An answer learns the speed on the event loop: the file is written by a thread of its own,
    so a slow disk never holds the loop. Saves made meanwhile are written once, the latest."""
    import os
    import threading

    disk = threading.Event()
    replaced = []

    def slow_replace(src, dst):
        # only this book's file: a save another test's book left running may land meanwhile
        if Path(dst) == tmp_path / FILE:
            disk.wait(30)
            replaced.append(dst)
        os.rename(src, dst)

    monkeypatch.setattr("rag.speed.os.replace", slow_replace)
    book = SpeedBook(tmp_path / FILE)
    done = threading.Event()

    def learn():
        for prompt_seconds in (1.0, 2.0, 4.0):
            book.observe("m", Usage(prompt_tokens=400, prompt_seconds=prompt_seconds), "x" * 1400)
        done.set()

    threading.Thread(target=learn).start()
    assert done.wait(30), "observe waited for the disk"
    assert not (tmp_path / FILE).exists()
    disk.set()
    book.flush()
    assert len(replaced) <= 2  # the first save, then the rest at once
    assert SpeedBook(tmp_path / FILE).get("m").read_tps == pytest.approx(book.get("m").read_tps)
