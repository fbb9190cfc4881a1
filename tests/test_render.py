"""Every table llmctl shows people fits an 80-column terminal: each is rendered from realistic
data (Common Crawl-sized counts, long paths, long task names) into an 80-column console, and no
line is wider than 80 and nothing is cut with "…" (text folds onto more lines; numbers and
headers are laid out to fit whole)."""

import io
from types import SimpleNamespace

import pytest
from rich.cells import cell_len
from rich.console import Console

from llmctl.artifacts.manifest import Manifest
from llmctl.cli import render

WIDTH = 80
LONG_OUT = "/mnt/data/common-crawl/CC-MAIN-2024-10/pipeline-runs/2024-03-18/fineweb-edu-threshold-3/filtered"


@pytest.fixture
def screen(monkeypatch):
    """What the render functions print, to stderr or stdout, as an 80-column terminal shows it."""
    buf = io.StringIO()
    console = Console(file=buf, width=WIDTH, highlight=False, color_system=None)
    monkeypatch.setattr(render, "err", console)
    monkeypatch.setattr(render, "stdout", lambda: console)
    return buf


def check(buf: io.StringIO, *whole: str) -> str:
    """No line over 80 columns, no "…", and each of `whole` (numbers, headers) on one line."""
    text = buf.getvalue()
    lines = text.splitlines()
    assert lines, "nothing rendered"
    too_wide = [ln for ln in lines if cell_len(ln) > WIDTH]
    assert not too_wide, "\n".join(too_wide)
    assert "…" not in text, text
    for w in whole:
        assert any(w in ln for ln in lines), f"{w!r} is not whole on any line:\n{text}"
    return text


def manifest(stage: str, counts: dict, wall: float = 3712.4) -> Manifest:
    return Manifest(kind="docs", stage=stage, counts=counts, outputs=[{}] * 64, wall_seconds=wall)


def test_stage_summary(screen):
    counts = {"errors": 3, "in": 3_412_887, "out": 2_187_004, "records": 10_238_661, "rejected": {"lang": 0}, "shards": 1_024,
              "skipped": {"decode": 1_208, "empty": 88_313, "not_html": 61_420, "not_response": 6_825_774, "status": 301_552,
                          "timeout": 17, "too_large": 4_006, "truncated": 12, "url": 98_765}}
    render.report(manifest("crawl-extract", counts), LONG_OUT, quiet=False, as_json=False)
    check(screen, "6,825,774", "skipped.not_response", "docs/s")
    render.report(manifest("train", {"steps": 19_073, "tokens": 10_000_000_000, "val_bits_per_byte": 0.912345}), "out/run",
                  quiet=False, as_json=False, rate_key="tokens")
    assert "tokens/s" in check(screen)


def test_filter_funnel(screen):
    counts = {"in": 2_187_004, "kept": 1_004_112, "chars_in": 9_876_543_210, "chars_kept": 4_321_987_654}
    rows = [{"step": s, "docs_removed": d, "docs_removed_pct": 100 * d / 2_187_004, "chars_removed": c,
             "chars_removed_pct": 100 * c / 9_876_543_210}
            for s, d, c in [("language", 310_224, 1_234_567_890), ("gopher_repetition", 121_003, 987_654_321),
                            ("gopher_quality", 502_118, 2_345_678_901), ("c4", 20_101, 123_456_789),
                            ("fineweb", 229_446, 863_198_655), ("repeated_ngrams", 0, 0)]]
    render.funnel(SimpleNamespace(counts=counts), rows)
    check(screen, "-2,345,678,901", "9,876,543,210", "gopher_repetition", "% chars", "43.8%")


def test_dedup_tables(screen):
    counts = {"s_curve": {"bands": 14, "rows": 8, "threshold": 0.719,
                          "p_flag": {"0.3": 0.0009, "0.5": 0.0533, "0.7": 0.5645, "0.8": 0.9235, "0.95": 1.0}},
              "clusters": {"1": 1_804_331, "2": 171_245, "3-5": 40_012, "6-10": 5_113, "11-100": 1_270, ">100": 31}}
    render.dedup_tables(counts)
    check(screen, "P(flagged)", "0.9235", "1,804,331", "threshold ~0.719")


def test_decontam_table(screen):
    tasks = {name: {"items": items, "items_contaminated": found, "share": found / items, "over_threshold": found / items > 0.02,
                    "docs_hit": docs, "ngrams_matched": m, "ngrams": total, "short_items": short}
             for name, items, found, docs, m, total, short in [
                 ("gsm8k_test", 1_319, 12, 3_044, 1_871, 182_004, 0),
                 ("hellaswag_validation", 10_042, 1_730, 88_512, 61_200, 1_354_771, 114),
                 ("mmlu_all_test", 14_042, 97, 10_004, 4_090, 2_876_005, 2_113)]}
    cfg = SimpleNamespace(ngram=13, min_overlap=1, threshold=0.02)
    render.decontam_tasks(manifest("decontam", {"tasks": tasks}), cfg, [LONG_OUT + "/decontam.json"])
    check(screen, "61,200/1,354,771", "17.23%*", "mmlu_all_test", "n-grams", "short", "sharing a 13-gram")


def test_tokenizer_report(screen):
    r = {"tokenizer": LONG_OUT + "/tokenizer/tokenizer.json", "vocab_size": 32_768, "eos_id": 0, "encoder": "tiktoken",
         "sample_docs": 10_000, "bytes_per_token": 4.4213, "chars_per_token": 4.3902, "vocab_used": 31_002, "vocab_utilization": 0.9461,
         "special_tokens": {"<|endoftext|>": 0, "<|system|>": 1, "<|user|>": 2, "<|assistant|>": 3, "<|end|>": 4, "<|pad|>": 5},
         "languages": {"en": {"docs": 9_112, "tokens_per_char": 0.2278, "premium_vs_en": 1.0},
                       "de": {"docs": 312, "tokens_per_char": 0.3391, "premium_vs_en": 1.489}},
         "longest_tokens": [{"id": 31_877, "text": " " * 40 + "=" * 30, "bytes": 70},
                            {"id": 30_012, "text": " internationalization", "bytes": 21}]}
    render.tokenizer_report(r)
    check(screen, "premium vs en", "vocab_utilization", "31877", "1.489")


def test_eval_results_table(screen):
    def score(mean, n, se, lo, hi, interval="wald"):
        return {"n": n, "mean": mean, "se": se, "ci_low": lo, "ci_high": hi, "interval": interval}

    results = {"tasks": {
        "loss:val": {"n": 1_953, "headline": "bits_per_byte",
                     "metrics": {"bits_per_byte": score(0.912345, 1_953, 0.0021, 0.9082, 0.9165), "loss": {"value": 2.7654, "n": 1_999_872},
                                 "perplexity": {"value": 15.8853, "n": 1_999_872}}},
        "hellaswag:hellaswag_validation": {"n": 10_042, "headline": "acc_norm",
                                           "metrics": {m: score(0.3127, 10_042, 0.0046, 0.3036, 0.3218)
                                                       for m in ("acc", "acc_norm", "acc_per_token", "acc_pmi")}},
        "gsm8k:test": {"n": 1_319, "headline": "acc",
                       "metrics": {"acc": score(0.0432, 1_319, 0.0041, 0.0352, 0.0512), "acc_flexible": score(0.0912, 1_319, 0.0079, 0.0757, 0.1067),
                                   "well_formed": score(0.4412, 1_319, 0.0137, 0.4144, 0.4680),
                                   "pass@1": score(0.0432, 1_319, 0.0041, 0.0352, 0.0512), "pass@8": score(0.1871, 1_319, 0.0101, 0.1673, 0.2069),
                                   "pass@1_flexible": score(0.0912, 1_319, 0.0079, 0.0757, 0.1067),
                                   "pass@8_flexible": score(0.3120, 1_319, 0.0128, 0.2869, 0.3371), "maj@16": score(0.0607, 1_319, 0.0066, 0.0478, 0.0736)}},
        "mc:cloze": {"n": 40, "headline": "acc_norm",
                     "metrics": {"acc": score(0.3, 40, 0.0725, 0.1807, 0.4543, "wilson"), "acc_norm": score(0.2, 40, 0.0632, 0.1050, 0.3476, "wilson"),
                                 "acc_per_token": score(0.275, 40, 0.0706, 0.1611, 0.4284, "wilson")}},
        "gsm8k:arithmetic": {"n": 300, "headline": "acc", "metrics": {"acc": score(0.5167, 300, 0.0289, 0.4601, 0.5732)}},
    }}
    render.eval_results(results, 1234.5)
    text = check(screen, "acc_norm *", "acc_per_token", "bits_per_byte *", "[0.3036, 0.3218]", "95% interval", "15.8853",
                 "n = 10,042", "lm-eval's acc_norm", "pass@8_flexible", "well_formed", "flexible-extract")
    assert "acc_per_token *" not in text and "headline" in text


def test_eval_compare_tables(screen):
    def row(task, metric, n, a, b, se, z, need, only_a=0, only_b=0):
        return {"task": task, "metric": metric, "n": n, "only_a": only_a, "only_b": only_b, "mean_a": a, "mean_b": b, "diff": a - b,
                "se": se, "z": z, "ci_low": a - b - 1.96 * se, "ci_high": a - b + 1.96 * se, "questions_needed": need}

    r = {"tasks": [row("gsm8k:arithmetic", "acc", 300, 0.5167, 0.1833, 0.0295, 11.3, 42),
                   row("hellaswag:hellaswag_validation", "acc_norm", 10_042, 0.3127, 0.3161, 0.0031, -1.1, 61_204, only_b=3),
                   row("loss:val", "bits_per_byte", 1_953, 0.9123, 0.9345, 0.0008, -27.75, 12),
                   row("mc:cloze", None, 200, 0.45, 0.45, 0.0, 0.0, None)]}
    render.eval_compare(r, "out/demo/eval-rl", LONG_OUT + "/eval-sft")
    check(screen, "questions", "to detect", "61,204", "[-0.0095, +0.0027]", "+0.3334", "10,042", "bits_per_byte",
          "A − B", "only in B")


def test_eval_compare_split_and_pass_at_k_tables(screen):
    def paired(n, a, b, se):
        return {"n": n, "mean_a": a, "mean_b": b, "diff": a - b, "se": se, "z": (a - b) / se, "ci_low": a - b - 1.96 * se,
                "ci_high": a - b + 1.96 * se}

    def score(mean, se):
        return {"n": 1_319, "mean": mean, "se": se, "ci_low": mean - 1.96 * se, "ci_high": mean + 1.96 * se, "interval": "wald"}

    curve = [{"k": k, "a": score(0.72 + 0.2 * (1 - 1 / k), 0.012), "b": score(0.3433 + 0.6 * (1 - 1 / k), 0.013),
              "diff": paired(1_319, 0.72 + 0.2 * (1 - 1 / k), 0.3433 + 0.6 * (1 - 1 / k), 0.0131)} for k in range(1, 33)]
    t = {"task": "gsm8k:gsm8k_test_with_a_long_name", "metric": "acc", "n": 1_319, "only_a": 0, "only_b": 0, "mean_a": 0.72,
         "mean_b": 0.3433, "diff": 0.3767, "se": 0.0281, "z": 13.4, "ci_low": 0.3216, "ci_high": 0.4318, "questions_needed": 42,
         "split": {"format": paired(1_319, 0.9871, 0.4412, 0.0139), "content": paired(1_319, 0.7301, 0.6023, 0.0166),
                   "strict_given_format": paired(581, 0.7285, 0.7005, 0.0213)},
         "pass_at_k": {"K": 32, "n": 1_319, "curve": curve, "cross_k": 18}}
    render.eval_compare({"tasks": [t]}, "out/demo/eval-rl", LONG_OUT + "/eval-sft")
    text = check(screen, "what A − B is made of", "strict | wf", "[+0.5187, +0.5731]", "pass@k", "A [95%]",
                 "0.720 [0.696, 0.744]", "18 ×", "+0.5459")
    assert "changes sign at k = 18" in " ".join(text.split())


def test_rl_step_lines(screen):
    rec = {"step": 1000, "reward_mean": 0.734375, "accuracy": 0.71875, "response_length": 1234.5, "zero_variance_share": 0.375,
           "generate_s": 123.4, "train_s": 45.6, "eval": {"mean": 0.5167, "ci_low": 0.4601, "ci_high": 0.5732}}
    render.rl_step(rec, 1000)
    render.rl_step({**rec, "step": 7, "response_length": 41.2, "generate_s": 3.1, "train_s": 1.2, "eval": None}, 40)
    text = check(screen, "step 1000/1000", "held-out 0.517 [0.460, 0.573]", "train 45.6s")
    assert text.splitlines()[-1].startswith("step 7/40")  # a short line stays one line


def test_train_status_lines(screen, monkeypatch):
    status = render.TrainStatus()
    s = SimpleNamespace(step=19_073, total_steps=19_073, loss=2.765432, lr=6e-5, tokens_per_s=955_630.0, mfu=0.4012,
                        val={"loss": 2.7712, "bits_per_byte": 0.9123})
    status.step(s)
    check(screen, "step 19073/19073", "bits/byte 0.9123")


def test_inspect_view(screen):
    info = {"path": LONG_OUT, "kind": "docs", "stage": "filter", "created": "2024-03-18T11:02:33Z", "files": 1_024, "rows": 2_187_004,
            "bytes": 9_123_456_789,
            "counts": {"in": 3_412_887, "rejected": {"gopher_repetition.dup_line_frac": 61_420}},
            "schema": {"id": "string", "text": "string", "metadata": "struct<url: string, date: string, warc_path: string, "
                                                                    "warc_offset: int64, lang_score: double>"},
            "samples": [{"id": "<urn:uuid:b869e769-52b7-5ac3-934c-216e3cf9f934>",
                         "text": "Two Towns of Harrowdale: Fenworth and Kelmoor. Fenworth lies on the Ferle in Harrowdale.",
                         "url": "https://county-herald.example/nature/1585/two-towns-of-harrowdale-fenworth-and-kelmoor?utm_source=x",
                         "warc_path": "s3://commoncrawl/crawl-data/CC-MAIN-2024-10/segments/1707947473347.11/warc/"
                                      "CC-MAIN-20240220211055-20240221001055-00000.warc.gz",
                         "warc_offset": 83_012_455}],
            "errors": [{"file": "/mnt/data/cc/CC-MAIN-20240220211055-20240221001055-00417.warc.gz", "offset": 1_073_741_824,
                        "error": "gzip member ends early: the record is truncated (damaged download?)"}]}
    render.inspect_view(info)
    check(screen, "2,187,004", "9,123,456,789", "83012455", "1073741824", "warc_offset", "gopher_repetition.dup_line_frac")


def test_lineage_tree(screen):
    def node(path, stage, inputs):
        return {"path": path, "kind": "docs", "stage": stage, "created": "2024-03-18T11:02:33Z", "inputs": inputs}

    warc = {"path": "/mnt/data/cc/CC-MAIN-2024-10/segments/1707947473347.11/warc/CC-MAIN-20240220211055-20240221001055-00000.warc.gz",
            "kind": "file", "sha256": "e6c775bc39d2" * 5, "changed": True}
    tree = node(LONG_OUT + "/rl", "rl", [node(LONG_OUT + "/sft", "train", [node(LONG_OUT + "/run", "train", [
        node(LONG_OUT + "/tokens", "tokenize", [node(LONG_OUT + "/dedup", "dedup", [node(LONG_OUT + "/filtered", "filter", [
            node(LONG_OUT + "/docs", "crawl-extract", [warc])])])])])])])
    render.lineage_tree(tree)
    check(screen, "sha256:e6c775bc39d2", "llmctl crawl-extract")


def test_plan_hardware_list(screen):
    from llmctl.plan import load_table
    from llmctl.cli.plan_tables import HARDWARE_HEADERS, hardware_rows

    render.hardware_list(hardware_rows(load_table()), HARDWARE_HEADERS)
    check(screen, "TFLOP/s", "FLOP/B", "2,250.0", "NVIDIA GB200 (NVL72), per GPU")


def test_plan_report(screen):
    from llmctl.plan import load_preset, plan
    from llmctl.cli.plan_tables import render as plan_tables

    arch, train = load_preset("fineweb-0.5b")
    for t in plan_tables(plan(arch, train=train, tokens=10e9, gpus=8, gpu="h100")):
        render.stdout().print(t)
    check(screen, "489,288,960", "memory per GPU")
