"""The command line as a user runs it: exit codes, messages and JSON shapes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli import main

from conftest import EXAMPLES, REPO, THREADS


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def cli_config(tmp_path_factory):
    """A config over the sample notes, indexed once through the CLI."""
    tmp = tmp_path_factory.mktemp("cli")
    notes = tmp / "notes"
    shutil.copytree(EXAMPLES, notes)
    cfg = tmp / "config.yaml"
    cfg.write_text("source:\n  kind: files\n  path: notes\nstate_dir: data\nleanote:\n  base_url: http://notes.home:9000\n"
                   f"embedder: {{threads: {THREADS}}}\n")
    assert main(["--config", str(cfg), "index"]) == 0
    return cfg


def test_index_json_summary(cli_config, capsys):
    code, out, _ = run(capsys, "--config", str(cli_config), "index", "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["unchanged"] == 15 and summary["chunks_embedded"] == 0
    for key in ("added", "updated", "deleted", "skipped", "seconds"):
        assert key in summary


def test_search_json_shape(cli_config, capsys):
    code, out, _ = run(capsys, "--config", str(cli_config), "search", "付款失败后第一次重试要等多久", "--json", "-k", "3")
    assert code == 0
    result = json.loads(out)
    assert result["user_id"] == "local"
    assert len(result["hits"]) == 3
    hit = result["hits"][0]
    assert set(hit) == {"note_id", "title", "notebook", "heading", "url", "score", "text"}
    assert hit["title"] == "支付接口调用的重试策略" and hit["notebook"] == "编程 / Python"


def test_batch_search_one_line_per_query_in_order(cli_config, capsys, tmp_path):
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        '{"id": "a", "question": "retry_count"}\n\n{"id": "b", "question": "家里路由器的 DHCP 范围", "user_id": "local"}\n',
        encoding="utf-8",
    )
    code, out, _ = run(capsys, "--config", str(cli_config), "search", "--queries", str(queries), "--json", "-k", "2")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["id"] for line in lines] == ["a", "b"]
    assert all(len(line["hits"]) == 2 for line in lines)
    assert lines[1]["hits"][0]["title"] == "家庭网络与路由器设置"


def test_batch_search_rejects_a_bad_file_before_any_work(cli_config, capsys, tmp_path):
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": 1, "question": "ok"}\n{not json}\n{"id": 3}\n', encoding="utf-8")
    code, out, err = run(capsys, "--config", str(cli_config), "search", "--queries", str(queries), "--json")
    assert code == 2 and out == ""
    assert f"{queries}:2: not JSON" in err and f"{queries}:3: needs a non-empty 'question' string" in err


def test_ask_json_shape_and_citation_links(cli_config, capsys):
    code, out, _ = run(capsys, "--config", str(cli_config), "ask", "红烧肉要炖多久？", "--json")
    assert code == 0
    answer = json.loads(out)
    assert set(answer) >= {"answer", "used_llm", "grounded", "citations", "timings_ms"}
    assert answer["used_llm"] is False and answer["grounded"] is True
    first = answer["citations"][0]
    assert first["n"] == 1 and first["title"].startswith("红烧肉")
    assert "[1]" in answer["answer"] and "60 分钟" in answer["answer"]
    assert set(answer["timings_ms"]) >= {"retrieve", "total"}


def test_ask_text_lists_sources(cli_config, capsys):
    code, out, _ = run(capsys, "--config", str(cli_config), "ask", "How much disk may the journal use?")
    assert code == 0
    assert "Reading systemd journal logs" in out and "file://" in out


def test_status_json(cli_config, capsys):
    code, out, _ = run(capsys, "--config", str(cli_config), "status", "--json")
    assert code == 0
    status = json.loads(out)
    assert status["embedder"] == "use:multilingual-v3" and status["dim"] == 512
    assert status["users"] == [{"user_id": "local", "notes": 15, "chunks": status["users"][0]["chunks"]}]
    assert status["users"][0]["chunks"] >= 15
    assert status["last_sync"]["ok"] is True and status["backend"] == "edge"


def test_unknown_user_is_a_usage_error(cli_config, capsys):
    code, _, err = run(capsys, "--config", str(cli_config), "search", "x", "--user", "nobody")
    assert code == 2 and "no notes of user 'nobody'" in err and "local" in err


def test_empty_question_is_a_usage_error(cli_config, capsys):
    code, _, err = run(capsys, "--config", str(cli_config), "ask", "  ")
    assert code == 2 and "empty" in err
    code, _, err = run(capsys, "--config", str(cli_config), "search", "")
    assert code == 2 and "the question is empty" in err


def test_search_needs_a_query_or_a_file(cli_config, capsys):
    code, _, err = run(capsys, "--config", str(cli_config), "search")
    assert code == 2 and "QUERY or --queries" in err


def test_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("source: {kind: files, path: .}\nretrieval:\n  top_kk: 3\n")
    code, _, err = run(capsys, "--config", str(cfg), "search", "x")
    assert code == 2
    assert "retrieval.top_kk: unknown key (did you mean retrieval.top_k?)" in err
    assert "Traceback" not in err


def test_search_before_index_says_to_index(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("source: {kind: files, path: .}\nstate_dir: data\n")
    code, _, err = run(capsys, "--config", str(cfg), "search", "x")
    assert code == 2 and "leanote-rag index" in err


def test_missing_source_folder_is_a_usage_error(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("source: {kind: files, path: nowhere}\nstate_dir: data\n")
    code, _, err = run(capsys, "--config", str(cfg), "index")
    assert code == 2 and "is not a folder of notes" in err


def test_mongodb_source_needs_the_url_variable(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("source:\n  kind: mongodb\nstate_dir: data\n")
    code, _, err = run(capsys, "--config", str(cfg), "index")
    assert code == 2 and "source.url_env is required" in err
    cfg.write_text("source:\n  kind: mongodb\n  url_env: LR_TEST_MONGO\nstate_dir: data\n")
    monkeypatch.delenv("LR_TEST_MONGO", raising=False)
    code, _, err = run(capsys, "--config", str(cfg), "index")
    assert code == 2 and "LR_TEST_MONGO (named by source.url_env) is not set" in err


def test_runtime_failure_exits_1_without_traceback_unless_debug(cli_config, capsys):
    from rag import config
    from rag.index.store_edge import EdgeStore

    holder = EdgeStore(config.load(cli_config).state_dir / "qdrant", 512)  # the index is busy
    try:
        code, _, err = run(capsys, "--config", str(cli_config), "search", "x")
        assert code == 1 and "open in another process" in err and "Traceback" not in err
        code, _, err = run(capsys, "--config", str(cli_config), "--debug", "search", "x")
        assert code == 1 and "Traceback" in err
    finally:
        holder.close()


def test_unreadable_manifest_asks_for_a_rebuild(cli_config, capsys):
    manifest = cli_config.parent / "data" / "qdrant" / "leanote-rag.json"
    saved = manifest.read_text()
    manifest.write_text("{not json")
    try:
        code, _, err = run(capsys, "--config", str(cli_config), "search", "x")
        assert code == 2 and "index --rebuild" in err
    finally:
        manifest.write_text(saved)


@pytest.mark.slow
def test_console_script_runs_in_a_real_process(cli_config):
    exe = Path(sys.executable).with_name("leanote-rag")
    out = subprocess.run([str(exe), "--config", str(cli_config), "search", "retry_count", "--json", "-k", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["hits"][0]["title"] == "支付接口调用的重试策略"


@pytest.mark.slow
def test_second_process_is_refused_while_the_index_is_open(cli_config):
    from rag import config
    from rag.index.store_edge import EdgeStore

    settings = config.load(cli_config)
    holder = EdgeStore(settings.state_dir / "qdrant", 512)
    try:
        exe = Path(sys.executable).with_name("leanote-rag")
        out = subprocess.run([str(exe), "--config", str(cli_config), "search", "x"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 1
        assert "open in another process" in out.stderr and "Traceback" not in out.stderr
    finally:
        holder.close()


def test_help_lists_the_plugin_commands(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("index", "search", "ask", "status", "eval"):
        assert command in out



def test_ask_leaves_out_notes_far_below_the_best(cli_config, capsys):
    code, out, _ = run(capsys, "--config", str(cli_config), "ask", "家里路由器自动分给设备的 IP 是从哪到哪？", "--json")
    assert code == 0
    answer = json.loads(out)
    assert [c["title"] for c in answer["citations"]] == ["家庭网络与路由器设置"]
    assert "192.168.50.100–192.168.50.199" in answer["answer"]


def test_heading_does_not_repeat_the_title(cli_config, capsys):
    code, out, _ = run(capsys, "--config", str(cli_config), "search", "journalctl -f follow", "--json", "-k", "1")
    hit = json.loads(out)["hits"][0]
    assert hit["title"] == "Reading systemd journal logs"
    assert not hit["heading"].startswith("Reading systemd journal logs")


def test_status_before_any_index_says_what_to_do(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("source: {kind: files, path: .}\nstate_dir: data\n")
    code, out, _ = run(capsys, "--config", str(cfg), "status")
    assert code == 0
    assert "no index yet: run `leanote-rag index`" in out and "last sync: never" in out
    assert "None" not in out and "embedder: use:multilingual-v3 (the first index pass embeds with it)" in out


def test_batch_search_with_a_failing_query_exits_1(cli_config, capsys, tmp_path):
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "ok", "question": "retry_count"}\n{"id": "bad", "question": "x", "user_id": "nobody"}\n')
    code, out, _ = run(capsys, "--config", str(cli_config), "search", "--queries", str(queries), "--json")
    assert code == 1
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["hits"] and "no notes of user 'nobody'" in lines[1]["error"]


@pytest.mark.slow
def test_one_shot_commands_print_results_and_log_only_with_v(cli_config):
    """status, search, index: results on stdout, no INFO log lines unless -v (-vv: DEBUG)."""
    exe = str(Path(sys.executable).with_name("leanote-rag"))

    def cli(*args):
        out = subprocess.run([exe, "--config", str(cli_config), *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out

    for args in (("status",), ("search", "retry_count", "-k", "1"), ("index",)):
        quiet = cli(*args)
        assert quiet.stdout and " INFO " not in quiet.stderr and " DEBUG " not in quiet.stderr, (args, quiet.stderr)
        told = cli("-v", *args)
        assert told.stdout == quiet.stdout or args == ("index",)
        assert "INFO bot.api.client: no daemon runs for" in told.stderr and " DEBUG " not in told.stderr, told.stderr
    assert " DEBUG " in cli("-vv", "search", "retry_count").stderr


def test_v_after_the_command_is_taken_as_before_it(cli_config):
    """`leanote-rag doctor -v`: the -v a person adds to the line they just ran, for every command."""
    off = cli_config.with_name("v-after.yaml")
    off.write_text(cli_config.read_text() + "ollama: {enabled: false}\nrerank: {kind: none}\n")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "bot.cli", "--config", str(off), *args], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})

    doctor = cli("doctor", "-v")
    assert doctor.returncode == 0 and "ok   config:" in doctor.stdout, doctor.stderr
    told = cli("status", "--verbose")
    assert told.returncode == 0 and "INFO bot.api.client: no daemon runs for" in told.stderr, told.stderr
    quiet = cli("status")
    assert quiet.returncode == 0 and " INFO " not in quiet.stderr, quiet.stderr


def test_an_error_repeats_only_the_start_of_a_long_id(cli_config, capsys):
    long_id = "u" * 5000
    for args in (("search", "retry_count", "--user", long_id), ("memory", "reject", long_id)):
        code, out, err = run(capsys, "--config", str(cli_config), *args)
        assert code == 2 and "u" * 64 + "…" in err and "u" * 65 not in err and len(err) < 400, (args, err)


def test_ask_without_an_llm_says_so_first_in_one_plain_line(cli_config, capsys):
    """Nobody answers at ollama.host, or no LLM is configured: the first line says so (and
    what to do), then the passages are the answer; no library's error text."""
    from conftest import free_port

    nobody = f"http://127.0.0.1:{free_port()}"
    down = cli_config.with_name("ollama-down.yaml")
    down.write_text(cli_config.read_text() + f"ollama: {{host: '{nobody}', connect_retries: 0}}\n")
    off = cli_config.with_name("ollama-off.yaml")
    off.write_text(cli_config.read_text() + "ollama: {enabled: false}\n")
    question = "How do I follow one service's logs live?"
    code, out, err = run(capsys, "--config", str(down), "ask", question)
    assert code == 0 and err == ""
    first, second = out.splitlines()[:2]
    assert first == (f"No language model answered (cannot reach Ollama at {nobody}: nothing answers there; start Ollama, "
                     "or set ollama.enabled: false), so the passages below from your notes are the answer.")
    assert second.startswith("[1] ") and "All connection attempts failed" not in out and "journalctl" in out
    code, out, _ = run(capsys, "--config", str(down), "ask", "家里路由器自动分给设备的 IP 是从哪到哪？")
    assert code == 0 and out.startswith("语言模型没有回答（cannot reach Ollama at ") and "以下笔记段落就是回答。\n[1] " in out
    code, out, _ = run(capsys, "--config", str(off), "ask", question)
    assert code == 0 and out.startswith("No language model is configured (ollama.enabled: false), so the passages "
                                        "below from your notes are the answer.\n[1] ")
