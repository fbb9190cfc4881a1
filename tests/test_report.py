"""`llmctl report`: the demo's chain (crawl → filter → dedup → tokenize → train → mid → sft → rl, with
evals beside it) built small with the real CLI, then every section's numbers checked against the
manifests, metrics and result files they come from — read here with json/pyarrow, not through the
report's code — and missing stages checked to give no section."""

from __future__ import annotations

import base64
import json
import re
import shutil
import statistics
import subprocess
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import CRAWL, ROOT, llmctl
from llmctl.report.build import write_report
from test_train_stability import Spiky
from test_train_stability import cfg as stability_cfg
from test_train_stability import tokens as stability_tokens  # noqa: F401  (a fixture)
from test_train_stability import train as stability_train

TASKS = ROOT / "examples" / "tasks"
MODEL = ["--set", "model.n_layers=2", "--set", "model.d_model=64", "--set", "model.n_heads=4", "--set", "model.n_kv_heads=2",
         "--set", "model.d_ff=128"]  # the base run's; --init runs take the architecture of the run they start from
RUN = ["--set", "train.eval_windows=4", "--threads", "1", "-q"]
PRETRAIN = [*RUN, "--seq-len", "32", "--batch-tokens", "256", "--micro-batch", "8", "--eval-every", "4"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The Makefile demo's artifacts, each stage run by the CLI with tiny settings: one of the example
    WARC files, the first 200 SFT chats, held-out accuracy on the first 20 problems."""
    warcs = sorted(CRAWL.glob("*.warc.gz"))[:1]
    if not warcs:
        pytest.skip("examples/crawl not generated")
    d = tmp_path_factory.mktemp("report") / "demo"
    d.mkdir()
    for name, n in (("arithmetic-sft.jsonl", 200), ("arithmetic.jsonl", 20)):
        (d / name).write_text("".join((TASKS / name).read_text().splitlines(keepends=True)[:n]))
    llmctl("crawl-extract", *warcs, "-o", d / "docs", "--workers", "2", "-q", check=True)
    llmctl("filter", d / "docs", "-o", d / "filtered", "--config", "fineweb", "--keep-rejected", "--workers", "2", "-q", check=True)
    llmctl("dedup", d / "filtered", "-o", d / "dedup", "--config", "minhash", "-q", check=True)
    llmctl("tokenize", "train", d / "dedup", "-o", d / "tokenizer", "--vocab-size", "320", "-q", check=True)
    premium = llmctl("tokenize", "report", d / "tokenizer", "--sample", d / "docs", "--json", check=True).stdout  # every language
    (d / "tokenizer" / "report.json").write_bytes(premium)  # where report looks for the per-language premium
    for split in ("train", "val"):
        llmctl("tokenize", d / "dedup", "-o", d / "tokens" / split, "--tokenizer", d / "tokenizer", "--split", split,
               "--val-fraction", "0.05", "-q", check=True)
    tokens = [d / "tokens" / "train", "--val", d / "tokens" / "val"]
    gsm = ["-t", f"gsm8k:{d / 'arithmetic.jsonl'}", "--max-new-tokens", "8", "-q"]
    llmctl("train", *tokens, "-o", d / "run", *MODEL, *PRETRAIN, "--max-tokens", "2048", check=True)
    llmctl("train", *tokens, "-o", d / "mid", "--init", d / "run", "--schedule", "decay", *PRETRAIN, "--max-tokens", "1024", check=True)
    llmctl("eval", d / "run", "-o", d / "eval", "-t", f"loss:{d / 'tokens' / 'val'}", "-t", f"mc:{TASKS / 'cloze.jsonl'}",
           "--limit", "20", *gsm, check=True)
    llmctl("train", "--sft", d / "arithmetic-sft.jsonl", "--init", d / "mid", "-o", d / "sft", *RUN, "--seq-len", "128",
           "--batch-tokens", "1024", "--micro-batch", "8", "--max-tokens", "2048", check=True)
    llmctl("rl", d / "sft", "--prompts", TASKS / "arithmetic-train.jsonl", "--eval", d / "arithmetic.jsonl", "-o", d / "rl",
           "--config", "arith", "--steps", "2", "--prompts-per-step", "2", "-G", "4", "--max-new-tokens", "8",
           "--headroom-limit", "4", "-q", check=True)
    for m in ("sft", "rl"):
        llmctl("eval", d / m, "-o", d / f"eval-{m}", *gsm, check=True)
    llmctl("report", d / "rl", "-o", d / "report", check=True)
    return d


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def report_json(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def sections(r: dict) -> dict[str, dict]:
    return {s["key"]: s for s in r["sections"]}


def rows(section: dict, caption_start: str) -> list[list]:
    table = next(t for t in section["tables"] if t["caption"].startswith(caption_start))
    return table["rows"]


def test_every_stage_of_the_rl_lineage_has_its_section(demo):
    s = sections(report_json(demo / "report"))
    assert list(s) == ["crawl", "filter", "dedup", "tokenize", "train-1", "train-2", "train-3", "eval", "rl", "totals"]
    assert [s[k]["facts"]["role"] for k in ("train-1", "train-2", "train-3")] == ["pretraining", "midtraining", "SFT"]
    assert s["eval"]["sources"] == [str(demo / e) for e in ("eval", "eval-sft", "eval-rl")]  # found beside the runs


def test_data_sections_match_their_manifests(demo):
    s = sections(report_json(demo / "report"))
    docs = manifest(demo / "docs")["counts"]
    crawl = s["crawl"]
    assert crawl["facts"]["WARC records"] == docs["records"] and crawl["facts"]["documents out"] == docs["out"]
    assert crawl["facts"]["WARC files"] == 1 and crawl["facts"]["WARC bytes"] == sorted(CRAWL.glob("*.warc.gz"))[0].stat().st_size
    assert {r[0]: r[1] for r in rows(crawl, "records skipped")} == {
        **{f"skipped: {k}": v for k, v in docs["skipped"].items()}, **{f"rejected: {k}": v for k, v in docs["rejected"].items()}}
    langs = Counter(pq.read_table(sorted((demo / "docs").glob("part-*.parquet")), columns=["lang"]).column("lang").to_pylist())
    assert {r[0]: r[1] for r in rows(crawl, "documents kept, by")} == dict(langs)
    assert sum(langs.values()) == docs["out"]

    f = manifest(demo / "filtered")
    funnel = rows(s["filter"], "the funnel")
    left, chars = f["counts"]["in"], f["counts"]["chars_in"]
    assert funnel[0][1:4:2] == [left, chars]
    for row, label in zip(funnel[1:], f["config"]["step_labels"]):
        step = f["counts"]["funnel"][label]
        left, chars = left - step["docs_removed"], chars - step["chars_removed"] - step["chars_rewritten"]
        assert row[0] == label and row[1] == left and row[3] == chars
    assert funnel[-1][1] == f["counts"]["kept"] and funnel[-1][3] == f["counts"]["chars_kept"]
    top = sorted(f["counts"]["rejected"].items(), key=lambda kv: -kv[1])[:10]
    assert [r[:2] for r in rows(s["filter"], "top rejection")] == [list(kv) for kv in top]

    dd = manifest(demo / "dedup")["counts"]
    assert {r[0]: r[1:] for r in rows(s["dedup"], "removals")} == {k: [v["docs"], v["chars"]] for k, v in dd["removed"].items()}
    assert [r[0] for r in rows(s["dedup"], "removals")] == ["url", "exact", "minhash"]  # the order they run
    assert {r[0]: r[1] for r in rows(s["dedup"], "near-duplicate")} == dd["clusters"]
    assert [r[0] for r in rows(s["dedup"], "near-duplicate")][:3] == ["1", "2", "3-5"]  # by size, not as text
    assert {str(r[0]): r[1] for r in rows(s["dedup"], "the S-curve")} == dd["s_curve"]["p_flag"]
    assert s["dedup"]["facts"]["threshold (J at P = 0.5)"] == dd["s_curve"]["threshold"]

    tok = s["tokenize"]
    assert tok["facts"]["vocabulary"] == manifest(demo / "tokenizer")["counts"]["vocab_size"] == 320
    for row in rows(tok, "token artifacts"):
        c = manifest(demo / "tokens" / row[0])["counts"]
        assert row[2:5] == [c["docs"], c["tokens"], c["bytes"]] and row[5] == pytest.approx(c["bytes"] / c["tokens"], abs=1e-4)
    premium = json.loads((demo / "tokenizer" / "report.json").read_text())
    assert len(premium["languages"]) > 1 and tok["facts"]["bytes / token (report sample)"] == premium["bytes_per_token"]
    assert rows(tok, "per-language premium") == [[k, v["docs"], v["tokens_per_char"], v["premium_vs_en"]] for k, v in premium["languages"].items()]


def test_train_sections_match_manifests_metrics_and_the_flops_formula(demo):
    s = sections(report_json(demo / "report"))
    for key, run in (("train-1", "run"), ("train-2", "mid"), ("train-3", "sft")):
        facts, m = s[key]["facts"], manifest(demo / run)
        config = json.loads((demo / run / "config.json").read_text())
        recs = [json.loads(x) for x in (demo / run / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in recs if "loss" in r and "val" not in r]
        assert facts["tokens"] == m["counts"]["tokens"] and facts["steps"] == m["counts"]["steps"] == len(steps)
        assert facts["parameters"] == config["n_params"] and facts["wall seconds"] == m["wall_seconds"]
        # C = (6 N + 12 L h d_h (s+1)/2) D: a tied head's N does the head's matmul (spec compute §B1, §B3)
        mc, s_len = m["config"]["model"], m["config"]["train"]["seq_len"]
        per_token = 6 * config["n_params"] + 12 * mc["n_layers"] * mc["n_heads"] * mc["head_dim"] * (s_len + 1) / 2
        assert mc["tied"] and facts["training FLOPs"] == pytest.approx(per_token * m["counts"]["tokens"], rel=1e-12)
        assert facts["MFU (median over steps)"] == pytest.approx(statistics.median(r["mfu"] for r in steps), abs=1e-5)
        vals = [r for r in recs if "val" in r]
        if run != "sft":
            assert facts["final validation bits / byte"] == m["counts"]["val_bits_per_byte"]
            assert facts["unigram floor (bits / byte)"] == m["counts"]["val_unigram_bits_per_byte"]
            assert [r[:4] for r in rows(s[key], "validation")] == [[v["step"], v["tokens"], v["val"]["loss"], v["val"]["bits_per_byte"]] for v in vals]
            assert {Path(f["file"]).name for f in s[key]["figures"]} == {"loss.png", "bits_per_byte.png"}
    assert s["train-2"]["facts"]["started from"].startswith(str(demo / "run"))


def test_eval_and_rl_sections_match_results_and_rollouts(demo):
    s = sections(report_json(demo / "report"))
    scores = {(r[0], r[1], r[2]): r for r in rows(s["eval"], "every score")}
    for name in ("eval", "eval-sft", "eval-rl"):
        results = json.loads((demo / name / "results.json").read_text())
        for task, t in results["tasks"].items():
            for metric, v in t["metrics"].items():
                row = scores.pop((name, task, metric))
                assert row[4:8] == ([v["n"], v["mean"], v["ci_low"], v["ci_high"]] if "mean" in v else [v["n"], v["value"], None, None])
    assert not scores  # nothing shown that the results do not hold
    # the paired gap of RL over SFT: the mean of the per-item differences, from samples.parquet
    items = {n: {r["item"]: r["score"] for r in pq.read_table(demo / n / "samples.parquet").to_pylist()} for n in ("eval-rl", "eval-sft")}
    pair = next(r for r in rows(s["eval"], "paired") if r[:3] == ["eval-rl", "eval-sft", "gsm8k:arithmetic"])
    diffs = [items["eval-rl"][i] - items["eval-sft"][i] for i in items["eval-rl"]]
    assert pair[4] == len(diffs) == 20 and pair[7] == pytest.approx(sum(diffs) / len(diffs))

    rl, m = s["rl"], manifest(demo / "rl")
    recs = [json.loads(x) for x in (demo / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert rl["facts"]["steps"] == m["counts"]["steps"] == 2
    assert rl["facts"]["final held-out accuracy"] == m["counts"]["eval_accuracy"]
    assert rows(rl, "held-out accuracy") == [[r["step"], r["eval"]["n"], r["eval"]["mean"], r["eval"]["ci_low"], r["eval"]["ci_high"]]
                                             for r in recs if "eval" in r]
    assert rows(rl, "per step")[-1][:2] == [2, recs[-1]["reward_mean"]]
    for step in (1, 2):
        samples = pq.read_table(demo / "rl" / "rollouts" / f"step-{step:06d}.parquet").to_pylist()
        shown = rows(rl, f"sampled completions (step-{step:06d}")
        firsts = list(dict.fromkeys(x["prompt_index"] for x in samples))[:4]
        assert len(shown) == len(firsts) >= 2  # --prompts-per-step 2, and more with dynamic sampling
        for row, i in zip(shown, firsts):
            group = [x for x in samples if x["prompt_index"] == i]
            assert row[6] == [x["reward"] for x in group] and row[3] == max(row[6])
            assert [row[0], row[2]] in [[x["step"], x["completion"]] for x in group if x["reward"] == row[3]]
    assert {"reward.png", "accuracy.png", "length.png", "zero_variance.png"} <= {Path(f["file"]).name for f in rl["figures"]}

    totals = rows(s["totals"], "every artifact")
    expected = [demo / p for p in ("docs", "filtered", "dedup", "tokenizer", "tokens/train", "tokens/val", "run", "mid", "sft", "rl",
                                   "eval", "eval-sft", "eval-rl")]
    assert [Path(r[1]) for r in totals[:-1]] == expected
    assert [r[3] for r in totals[:-1]] == [manifest(p)["wall_seconds"] for p in expected]
    assert [r[4] for r in totals[:-1]] == [1 if p.name in ("run", "mid", "sft", "rl") else None for p in expected]
    for r, p in zip(totals, expected):
        assert r[6] == sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def test_markdown_and_html_show_the_figures(demo):
    out = demo / "report"
    md = (out / "report.md").read_text()
    figures = [f["file"] for sec in report_json(out)["sections"] for f in sec["figures"]]
    assert figures and all((out / f).is_file() and (out / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md) == figures  # links relative to the report folder
    assert "| --- |" in md or "| ---: |" in md
    html = (out / "index.html").read_text()
    srcs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert all(x.startswith(("data:image/png;base64,", "#")) for x in srcs)  # nothing fetched: self-contained
    images = [x for x in srcs if x.startswith("data:")]
    assert [base64.b64decode(x.split(",", 1)[1]) for x in images] == [(out / f).read_bytes() for f in figures]


def test_html_renders_in_headless_chromium(demo, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed")
    shot = tmp_path / "report.png"
    p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={shot}",
                        "--window-size=1280,4000", "--enable-logging=stderr", "--v=0", (demo / "report" / "index.html").as_uri()],
                       capture_output=True, text=True, timeout=120)
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    assert p.returncode == 0 and not console, console or p.stderr[-2000:]
    from PIL import Image

    im = Image.open(shot).convert("L")
    assert im.size == (1280, 4000)
    dark = sum(im.histogram()[:128])
    assert dark > 0.01 * 1280 * 4000  # text, tables and charts, not a blank page


def test_missing_stages_give_no_section(demo, tmp_path):
    # dedup alone: the data sections only (through the CLI, which prints where the report is)
    p = llmctl("report", demo / "dedup", "-o", tmp_path / "a", check=True)
    assert p.stdout.decode().splitlines() == [str(tmp_path / "a" / "index.html"), str(tmp_path / "a" / "report.md")]
    assert list(sections(report_json(tmp_path / "a"))) == ["crawl", "filter", "dedup", "totals"]
    # a chain without filter (dedup straight on the crawl): no filter section, nothing made up for it
    llmctl("dedup", demo / "docs", "-o", tmp_path / "dedup-raw", "--config", "minhash", "-q", check=True)
    assert [s.key for s in write_report(tmp_path / "dedup-raw", tmp_path / "b").report.sections] == ["crawl", "dedup", "totals"]
    # the midtraining run: its evals are the pretraining run's; eval-sft and eval-rl measured other models
    s = {x.key: x for x in write_report(demo / "mid", tmp_path / "c").report.sections}
    assert "rl" not in s and "train-3" not in s and s["eval"].sources == [str(demo / "eval")]
    # without discovery only the evals named are in
    s = {x.key: x for x in write_report(demo / "mid", tmp_path / "d", evals=[str(demo / "eval-sft")], discover=False).report.sections}
    assert s["eval"].sources == [str(demo / "eval-sft")]


def test_bad_input_is_one_line_exit_2(demo, tmp_path):
    for args in (["report", tmp_path, "-o", tmp_path / "r"], ["report", demo / "rl", "-o", demo / "run"],
                 ["report", demo / "rl", "-o", tmp_path / "r", "--eval", demo / "run"], ["report", demo / "rl", "-o", "-"]):
        p = llmctl(*args)
        err = p.stderr.decode().strip()
        assert p.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert llmctl("report", demo / "rl", "-o", tmp_path / "busy").returncode == 2
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_spikes_and_skipped_steps_from_the_run_that_had_them(stability_tokens, tmp_path):  # noqa: F811
    """A run whose step 15 spikes (test_train_stability's planted spike) under --on-spike skip-batch."""
    run = tmp_path / "run"
    m = stability_train(stability_tokens, run, stability_cfg(on_spike="skip-batch", max_steps=16), source=Spiky(stability_tokens, bad={14}))
    s = {x.key: x for x in write_report(run, tmp_path / "r").report.sections}
    assert list(s) == ["tokenize", "train", "totals"]  # tokens made from a Parquet file: no crawl, filter or dedup
    assert any("no per-language premium" in n for n in s["tokenize"].notes)  # no tokenize report beside the tokenizer
    spiked = [r for r in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()) if "spike" in r]
    table = next(t for t in s["train"].tables if t.caption.startswith("loss spikes"))
    assert table.rows == [[r["step"], r["loss"], r["spike"], True] for r in spiked] and [r[0] for r in table.rows] == [15]
    assert s["train"].facts["spike-skipped steps"] == m.counts["spike_skipped_steps"] == 1


# --- what an rl gain is made of (issue 34): controls beside the run, sampled evals, the sentence ---

@pytest.fixture(scope="module")
def gained(demo):
    """The demo fixture's rl run with, beside it, its two control runs (same tiny settings) and their
    greedy evals, and 4-sample evals of the SFT and RL models; reported after the demo's own report
    was written, so the tests above see the folder as it was."""
    d = demo
    gsm = ["-t", f"gsm8k:{d / 'arithmetic.jsonl'}", "--max-new-tokens", "8", "-q"]
    for control in ("random-reward", "shuffled-answers"):
        llmctl("rl", d / "sft", "--prompts", TASKS / "arithmetic-train.jsonl", "--eval", d / "arithmetic.jsonl", "-o", d / f"rl-{control}",
               "--config", "arith", "--steps", "2", "--prompts-per-step", "2", "-G", "4", "--max-new-tokens", "8",
               "--headroom-limit", "4", "--control", control, "-q", check=True)
        llmctl("eval", d / f"rl-{control}", "-o", d / f"eval-rl-{control}", *gsm, check=True)
    for m in ("sft", "rl"):
        llmctl("eval", d / m, "-o", d / f"eval-{m}-k4", *gsm, "-n", "4", "--temperature", "1.0", "--seed", "3", check=True)
    llmctl("report", d / "rl", "-o", d / "report-gain", check=True)
    return d


def counts(ev: Path) -> dict[int, dict]:
    return {r["item"]: r for r in pq.read_table(ev / "samples.parquet").to_pylist()}


def paired_mean(a: dict, b: dict, f) -> float:
    return statistics.fmean(f(a[i]) - f(b[i]) for i in a)


def test_rl_gain_split_and_pass_at_k_from_the_samples(gained):
    d = gained
    rl = sections(report_json(d / "report-gain"))["rl"]
    # each eval's strict, flexible and well-formed scores, as results.json has them
    for row in rows(rl, "strict (the task's answer rule)"):
        t = json.loads((d / row[0] / "results.json").read_text())["tasks"][row[2]]["metrics"]
        assert row[4:] == [t[k][f] for k in ("acc", "acc_flexible", "well_formed") for f in ("mean", "ci_low", "ci_high")]
        assert row[1] == ("rl" if row[0].startswith("eval-rl") else "sft")
    # the split of every run against the SFT model: mean paired differences of the per-item counts
    made_of = rows(rl, "what the gain is made of")
    assert {(r[0], r[1].split(" ")[0]) for r in made_of} == {
        ("rl", "eval-rl"), ("rl", "eval-rl-k4"), ("rl-random-reward", "eval-rl-random-reward"), ("rl-shuffled-answers", "eval-rl-shuffled-answers")}
    for r in made_of:
        ev = r[1].split(" ")[0]
        a, b = counts(d / ev), counts(d / ("eval-sft-k4" if ev.endswith("-k4") else "eval-sft"))
        f = {"strict (headline)": lambda x: x["correct"] / x["samples"], "format: well-formed share": lambda x: x["well_formed"] / x["samples"],
             "content: flexible accuracy": lambda x: x["correct_flexible"] / x["samples"]}.get(r[2])
        if f is None:  # strict among the items well-formed in both
            both = [i for i in a if a[i]["well_formed"] and b[i]["well_formed"]]
            assert r[3] == len(both)
            if len(both) > 1:
                assert r[6] == pytest.approx(statistics.fmean(a[i]["correct"] / a[i]["well_formed"] - b[i]["correct"] / b[i]["well_formed"] for i in both))
            continue
        assert r[3] == len(a) == 20 and r[6] == pytest.approx(paired_mean(a, b, f))
    # pass@k, k = 1 … 4: the unbiased estimator 1 - C(n-c, k)/C(n, k), averaged over the problems
    from math import comb
    a, b = counts(d / "eval-rl-k4"), counts(d / "eval-sft-k4")
    curve = rows(rl, "pass@k")
    assert [r[0] for r in curve] == [1, 2, 3, 4]
    for k, sft, rl_, gain, *_ in curve:
        est = {name: statistics.fmean(1 - comb(x["samples"] - x["correct"], k) / comb(x["samples"], k) for x in c.values())
               for name, c in (("sft", b), ("rl", a))}
        assert (sft, rl_, gain) == pytest.approx((est["sft"], est["rl"], est["rl"] - est["sft"]))
    assert any(Path(f["file"]).name == "pass_at_k_eval-rl-k4.png" for f in rl["figures"])
    assert (d / "report-gain" / "img" / "rl" / "pass_at_k_eval-rl-k4.png").stat().st_size > 1000


def test_rl_controls_beside_the_run_and_the_sentence(gained, tmp_path):
    d = gained
    rl = sections(report_json(d / "report-gain"))["rl"]
    table = rows(rl, "the real run and its controls")
    assert [r[:3] for r in table] == [["rl", "none", 0], ["rl-random-reward", "random-reward", 0], ["rl-shuffled-answers", "shuffled-answers", 0]]
    real = counts(d / "eval-rl")
    for r in table:
        m = manifest(d / r[0])
        assert r[3] == m["counts"]["eval_accuracy"]
        ev = counts(d / f"eval-{r[0]}")
        assert r[4] == pytest.approx(paired_mean(ev, counts(d / "eval-sft"), lambda x: x["score"]))
        if r[0] != "rl":  # the real run's lead over the control, paired on the same problems
            assert r[7] == pytest.approx(paired_mean(real, ev, lambda x: x["score"]))
        last = [json.loads(x) for x in (d / r[0] / "metrics.jsonl").read_text().splitlines() if "reward_mean" in x][-1]
        assert r[10:] == [last["reward_mean"], last.get("real_reward_mean", last["reward_mean"])]
    said = next(n for n in rl["notes"] if n.startswith("What the gain is made of"))
    strict = next(r for r in rows(rl, "what the gain is made of") if r[:3] == ["rl", "eval-rl (greedy) − eval-sft (greedy)", "strict (headline)"])
    assert f"{100 * strict[6]:+.1f} points [{100 * strict[7]:+.1f}, {100 * strict[8]:+.1f}]" in said
    assert "The random-reward control moved" in said and "The shuffled-answers control moved" in said
    # the evals of the controls are theirs, not the lineage's: the eval section does not list them
    assert not any("random-reward" in s for s in sections(report_json(d / "report-gain"))["eval"]["sources"])
    # without discovery, a control and the evals come in only when named
    named = write_report(d / "rl", tmp_path / "a", discover=False, controls=[str(d / "rl-random-reward")],
                         evals=[str(d / e) for e in ("eval-sft", "eval-rl", "eval-rl-random-reward")])
    r = next(s for s in named.report.sections if s.key == "rl")
    assert [row[0] for row in next(t for t in r.tables if t.caption.startswith("the real run and its controls")).rows] == ["rl", "rl-random-reward"]


def test_report_control_flag_errors_are_one_line(gained, tmp_path):
    d = gained
    for bad in (d / "rl", d / "eval-rl", tmp_path):  # not a control run, not an rl run, not an artifact
        p = llmctl("report", d / "rl", "-o", tmp_path / "r", "--control", bad)
        err = p.stderr.decode().strip()
        assert p.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_the_sentence_follows_the_intervals():
    from llmctl.report.sections.rl_gain import sentence

    def part(diff, half=0.05, n=100):
        return {"n": n, "diff": diff, "ci_low": diff - half, "ci_high": diff + half}

    class Ev:  # what the sentence reads of the eval it names
        task, label = "gsm8k:x", "eval-rl (greedy)"

    def said(strict, fmt, content, given):
        return sentence("rl", "sft", (Ev, Ev, {"strict": part(strict), "format": part(fmt), "content": part(content),
                                               "strict_given_format": part(given)}), [])
    assert "the gain is format:" in said(0.3, 0.5, 0.3, 0.0) and "no more often" in said(0.3, 0.5, 0.3, 0.0)
    assert "the gain is format and content" in said(0.3, 0.3, 0.3, 0.2)
    assert "the gain is content" in said(0.2, 0.0, 0.2, 0.2)
    assert "no gain its interval can tell from zero" in said(0.01, 0.3, 0.0, 0.0)
    assert "a loss" in said(-0.2, -0.3, -0.2, 0.0)
    assert "+30.0 points [+25.0, +35.0]" in said(0.3, 0.5, 0.3, 0.0)


def test_the_controls_clause_follows_the_intervals():
    from types import SimpleNamespace

    from llmctl.report.sections.rl_gain import sentence

    def part(diff, half=0.05):
        return {"n": 100, "diff": diff, "ci_low": diff - half, "ci_high": diff + half}

    class Ev:
        task, label = "gsm8k:x", "eval-rl (greedy)"

    real = (Ev, Ev, {"strict": part(0.4), "format": part(0.5), "content": part(0.4), "strict_given_format": part(0.0)})

    def clause(kind, gain, lead, bonus=0.0):
        c = SimpleNamespace(manifest=SimpleNamespace(config={"control": kind, "format_reward": bonus}), path=Path(f"rl-{kind}"))
        said = sentence("rl", "sft", real, [(c, (Ev, Ev, {"strict": part(gain)}, part(lead)))])
        return said[said.index(f"The {kind} control"):]
    assert "ignores the completions gives no gain here" in clause("random-reward", 0.0, 0.4)
    assert "costs accuracy here" in clause("random-reward", -0.1, 0.5)
    assert "gains as much as the real run" in clause("shuffled-answers", 0.38, 0.02, bonus=0.1)
    assert "the format bonus, 0.1" in clause("shuffled-answers", 0.38, 0.02, bonus=0.1)
    assert "gives part of the gain" in clause("shuffled-answers", 0.2, 0.2)
    assert "does better than the real run" in clause("shuffled-answers", 0.5, -0.1)
