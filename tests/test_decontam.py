"""decontam: planted canaries are found (13- and 8-grams), clean text stays clean, per-task report
counts, flag vs remove, report-only, malformed task files, empty input, workers and streaming."""

import glob
import json
import random

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from conftest import CRAWL, ROOT, llmctl, shared_file
from llmctl.data.dedup.normalize import normalized_words
from llmctl.errors import UsageError
from llmctl.data.decontam.against import EvalTask, item_texts, resolve_task_files
from llmctl.data.decontam.index import build_index, decontam_words, match_docs
from llmctl.data.decontam.run import DecontamConfig, run_decontam
from llmctl.tasks import read_records
from llmctl.runtime.options import RunOptions

# ---------------------------------------------------------------------------------------------
# helpers

SITE = ["Home", "About us", "Recipes", "Garden diary", "Contact", "Privacy policy", "Subscribe to the newsletter"]
FILLER = (
    "The kettle hummed in the corner of the {a} workshop while {n} sorted the {b} by colour. "
    "Nobody in {t} remembered when the {a} first opened, but the {b} in its window were famous. "
    "{n} wrote down the names of the {b} in a notebook bound with {a} thread. "
    "On the far wall hung a map of {t} with every {b} marked in faded ink. "
    "Visitors from {t} often asked whether the {a} {b} were for sale, and {n} always laughed."
).split(". ")
NAMES = ["Orlaith", "Benedek", "Sunniva", "Tamsin", "Quillon", "Maelis", "Ivarr", "Ysolde"]
TOWNS = ["Brackenmoor", "Kettlewick", "Fennhollow", "Ashcombe Vale", "Marrowby"]
THINGS = ["lanterns", "teapots", "spindles", "compasses", "inkwells", "weathervanes"]
ADJ = ["copper", "willow", "amber", "slate", "juniper", "saffron"]


def web_page(rng: random.Random, sentences: int = 30) -> str:
    """A web-like document: navigation, a body of varied sentences, a footer."""
    body = []
    for _ in range(sentences):
        s = rng.choice(FILLER).format(n=rng.choice(NAMES), t=rng.choice(TOWNS), b=rng.choice(THINGS), a=rng.choice(ADJ))
        body.append(s.rstrip(".") + ".")
    paras = [" ".join(body[i : i + 5]) for i in range(0, len(body), 5)]
    return "\n".join([" | ".join(SITE), *paras, f"© {rng.randint(2001, 2024)} {rng.choice(TOWNS)} Gazette. All rights reserved."])


def with_canary(rng: random.Random, canary: str, lead: str, tail: str) -> str:
    """The canary pasted in the middle of a long page, with its own lead-in and follow-up text."""
    page = web_page(rng).split("\n")
    mid = len(page) // 2
    return "\n".join(page[:mid] + [f"{lead} {canary} {tail}"] + page[mid:])


def write_docs(path, rows: list[dict]):
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("url", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def write_jsonl(path, records: list[dict]):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def read_rows(out, sub=""):
    parts = sorted(glob.glob(str(out / sub / "part-*.parquet")))
    return pa.concat_tables([pq.read_table(p) for p in parts]).to_pylist() if parts else []


def gsm8k_test() -> tuple[str, list[dict]]:
    path = shared_file("gsm8k/test.jsonl")
    return str(path), read_records(path)


def perturb(question: str, every: int = 10) -> str:
    """Replace every `every`-th word, so no run of `every` words survives unchanged."""
    words = question.split()
    return " ".join("CHANGED" if (i + 1) % every == 0 else w for i, w in enumerate(words))


def run(docs, tasks, out, workers=1, report=None, **cfg):
    return run_decontam([str(d) for d in docs], str(out) if out is not None else None, DecontamConfig(**cfg), [str(t) for t in tasks], RunOptions(workers=workers), report_path=report)


# ---------------------------------------------------------------------------------------------
# words and eval items


def test_words_keep_digits_unlike_dedup():
    assert decontam_words("Janet’s ducks lay 16 eggs, Café-au-lait!") == ["janet", "s", "ducks", "lay", "16", "eggs", "cafe", "au", "lait"]
    # dedup folds digits (its normalized_words); decontamination must not: other numbers, other problem
    assert normalized_words("12 apples") == normalized_words("34 apples")
    assert decontam_words("12 apples") != decontam_words("34 apples")


def test_item_texts_cover_the_task_shapes():
    recs = [
        {"context": "The sky is", "choices": ["blue", "green"], "label": 0},
        {"prompt": "Add 2 and 3.", "answer": "5"},
        {"question": "Tom has 3 pens.", "answer": "He has 3*2=<<3*2=6>>6 pens.\n#### 6"},
        {"ctx": "[header] How to bake. [title] Mix flour", "endings": ["and water.", "[step] and sand."], "label": 0},
        {"question": {"stem": "Which is a gas?", "choices": [{"text": "steam", "label": "A"}, {"text": "ice", "label": "B"}]}, "answerKey": "A"},
        {"question": "Which is a metal?", "choices": {"text": ["iron", "wood"], "label": ["A", "B"]}, "answerKey": "A"},
        {"goal": "Open a jar", "sol1": "twist the lid", "sol2": "bake the lid", "label": 0},
        {"sentence": "Ann gave Bea a book because _ was kind.", "option1": "Ann", "option2": "Bea", "answer": "1"},
        {"question": "2 + 2 =", "subject": "math", "choices": ["3", "4"], "answer": 1},
        {"text": "a plain passage"},
    ]
    got = item_texts(recs, "t.jsonl")
    assert got[0] == ["The sky is blue", "The sky is green"]
    assert got[1] == ["Add 2 and 3. 5"]
    assert got[2] == ["Tom has 3 pens. He has 3*2=6 pens.\n#### 6"]  # calculator annotations removed
    assert [decontam_words(p) for p in got[3]] == [["how", "to", "bake", "mix", "flour", "and", "water"], ["how", "to", "bake", "mix", "flour", "and", "sand"]]
    assert got[4] == ["Which is a gas? steam", "Which is a gas? ice"]
    assert got[5] == ["Which is a metal? iron", "Which is a metal? wood"]
    assert got[6] == ["Open a jar twist the lid", "Open a jar bake the lid"]
    assert got[7] == ["Ann gave Bea a book because Ann was kind.", "Ann gave Bea a book because Bea was kind."]
    assert got[8] == ["2 + 2 = 3", "2 + 2 = 4"]
    assert got[9] == ["a plain passage"]


def test_item_without_text_names_file_and_line(tmp_path):
    p = write_jsonl(tmp_path / "bad.jsonl", [{"question": "fine", "answer": "1"}, {"label": 3, "id": "x"}])
    with pytest.raises(UsageError, match=r"bad\.jsonl:2: no eval text found .*the record has: label, id"):
        item_texts(read_records(p), p)
    with pytest.raises(UsageError, match=r"x\.jsonl:1: 'choices' must be a list"):
        item_texts([{"context": "c", "choices": "abc", "_line": 1}], "x.jsonl")


def test_task_names(tmp_path):
    a = write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [{"question": "q", "answer": "a"}])
    b = write_jsonl(tmp_path / "arc_easy.jsonl", [{"question": "q", "answer": "a"}])
    assert resolve_task_files([a, b]) == [("gsm8k-test", a), ("arc_easy", b)]
    assert resolve_task_files([f"mine={a}"]) == [("mine", a)]
    assert [n for n, _ in resolve_task_files([str(tmp_path / "gsm8k")])] == ["gsm8k-test"]
    with pytest.raises(UsageError, match="both named"):
        resolve_task_files([a, a])


def test_short_items_match_whole_and_digits_matter():
    task = EvalTask("t", "t.jsonl", [["What is the boiling point of water"], ["Lena has 12 apples and 7 pears in 3 bags and 4 boxes at 5 stalls"]], [1, 2])
    index = build_index([task], 13, 1)
    assert index.item_short.tolist() == [True, False]
    texts = [
        "Quiz night! What is the boiling point of water? Shout it out.",  # the short item, whole
        "What is the boiling point of mercury",  # not the whole short item
        "Story: Lena has 12 apples and 7 pears in 3 bags and 4 boxes at 5 stalls today.",
        "Story: Lena has 13 apples and 8 pears in 2 bags and 6 boxes at 9 stalls today.",  # other numbers
    ]
    _, _, docs, items = match_docs(index, texts)
    assert sorted(zip(docs.tolist(), items.tolist())) == [(0, 0), (2, 1)]


# ---------------------------------------------------------------------------------------------
# planted canaries


@pytest.fixture
def canaries(tmp_path):
    """200 clean web pages plus GSM8K test questions planted in four of them."""
    gsm_path, recs = gsm8k_test()
    rng = random.Random(7)
    q1, q2, q3 = recs[10]["question"], recs[500]["question"], recs[1000]["question"]
    rows = [{"id": f"web-{i}", "text": web_page(rng), "url": f"https://gazette.example/{i}"} for i in range(200)]
    plants = {
        17: with_canary(rng, q1.upper().replace("’", "'"), "Puzzle of the week, sent in by a reader:", "Post your answer below; the best one wins a mug."),
        88: with_canary(rng, q2, "My son's homework tonight:", "We got a different answer than his teacher. Ideas?"),
        140: with_canary(rng, q2, "Found this on a forum —", "(reposted without the solution)"),
        171: with_canary(rng, perturb(recs[1000]["question"]), "A paraphrase:", "Thoughts?"),
    }
    for i, text in plants.items():
        rows[i]["text"] = text
    assert len(q3.split()) >= 30  # long enough that perturb leaves 8-grams but no 13-gram
    return write_docs(tmp_path / "docs" / "web.parquet", rows), gsm_path, recs


def test_planted_canaries_found_13gram(canaries, tmp_path):
    docs, gsm, _ = canaries
    m = run([docs], [gsm], tmp_path / "out", report=tmp_path / "r.json")
    assert m.counts["contaminated"] == 3 and m.counts["out"] == 197
    assert m.counts["rejected"] == {"decontam.gsm8k-test": 3}
    kept = {r["id"] for r in read_rows(tmp_path / "out")}
    assert {"web-17", "web-88", "web-140"}.isdisjoint(kept) and "web-171" in kept  # the perturbed one needs 8-grams
    t = m.counts["tasks"]["gsm8k-test"]
    assert (t["items"], t["items_contaminated"], t["docs_hit"]) == (1319, 2, 3)
    assert t["share"] == pytest.approx(2 / 1319, abs=1e-6) and not t["over_threshold"]
    assert 0 < t["ngrams_matched"] < t["ngrams"]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report == json.loads((tmp_path / "out" / "decontam.json").read_text())
    items = {i["index"]: i for i in report["tasks"]["gsm8k-test"]["contaminated_items"]}
    assert set(items) == {10, 500}
    assert items[10]["line"] == 11 and items[10]["docs"] == 1 and items[500]["docs"] == 2
    assert 0 < items[10]["coverage"] < 1  # the question, not its answer
    assert "_items" not in json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]


def test_planted_canaries_found_8gram(canaries, tmp_path):
    docs, gsm, _ = canaries
    m = run([docs], [gsm], tmp_path / "out", ngram=8, report_only=True)
    assert m.counts["contaminated"] == 4  # the perturbed question too
    report = json.loads((tmp_path / "out" / "decontam.json").read_text())
    assert {i["index"] for i in report["tasks"]["gsm8k-test"]["contaminated_items"]} == {10, 500, 1000}
    # min_overlap asks for more than one shared n-gram per item: every canary shares many
    m = run([docs], [gsm], tmp_path / "out2", ngram=8, report_only=True, min_overlap=3)
    assert m.counts["contaminated"] == 4


def test_flag_mode_keeps_everything_and_marks(canaries, tmp_path):
    docs, gsm, _ = canaries
    m = run([docs], [gsm], tmp_path / "out", mode="flag", keep_rejected=True)
    rows = read_rows(tmp_path / "out")
    assert len(rows) == 200 and m.counts["out"] == 200 and m.counts["contaminated"] == 3
    assert {r["id"] for r in rows if r["contaminated"]} == {"web-17", "web-88", "web-140"}
    assert all(r["contaminated_tasks"] == (["gsm8k-test"] if r["contaminated"] else []) for r in rows)
    assert all(r["url"].startswith("https://gazette.example/") for r in rows)  # other columns pass through
    assert not (tmp_path / "out" / "rejected").exists() and "rejected" not in m.counts


def test_remove_mode_keep_rejected(canaries, tmp_path):
    docs, gsm, _ = canaries
    run([docs], [gsm], tmp_path / "out", keep_rejected=True)
    rej = read_rows(tmp_path / "out", "rejected")
    assert {r["id"] for r in rej} == {"web-17", "web-88", "web-140"}
    assert all(r["reason"] == "decontam.gsm8k-test" and r["contaminated_tasks"] == ["gsm8k-test"] and r["url"] for r in rej)
    assert "contaminated" not in pq.read_schema(tmp_path / "out" / "part-00000.parquet").names


def test_per_task_report_two_tasks(tmp_path):
    _, recs = gsm8k_test()
    gsm = write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [{k: r[k] for k in ("question", "answer")} for r in recs[:40]])
    mc_items = [{"context": f"In the ledger of {t} the keeper of the {b} wrote that the first {b} arrived", "choices": ["before the flood of the river.", "after the great winter fair."], "label": 0} for t, b in zip(TOWNS, THINGS)]
    mc = write_jsonl(tmp_path / "cloze.jsonl", mc_items)
    rng = random.Random(3)
    rows = [{"id": f"d{i}", "text": web_page(rng), "url": "u"} for i in range(30)]
    rows[3]["text"] = with_canary(rng, recs[5]["question"], "Q:", "A: ?")
    rows[9]["text"] = with_canary(rng, recs[5]["question"] + " " + mc_items[2]["context"] + " after the great winter fair.", "Both:", "")
    rows[20]["text"] = with_canary(rng, recs[33]["question"], "Q:", "")
    docs = write_docs(tmp_path / "in" / "d.parquet", rows)
    m = run([docs], [gsm, mc], tmp_path / "out", keep_rejected=True, threshold=0.04)
    tasks = m.counts["tasks"]
    g = tasks["gsm8k-test"]
    assert (g["items"], g["items_contaminated"], g["docs_hit"], g["over_threshold"]) == (40, 2, 3, True)
    assert g["share"] == pytest.approx(2 / 40)
    assert tasks["cloze"]["items"] == 5 and tasks["cloze"]["items_contaminated"] == 1 and tasks["cloze"]["docs_hit"] == 1
    assert tasks["cloze"]["share"] == pytest.approx(0.2) and tasks["cloze"]["over_threshold"]
    # a doc hit by both tasks: reason names the first --against task, the list has both
    rej = {r["id"]: r for r in read_rows(tmp_path / "out", "rejected")}
    assert set(rej) == {"d3", "d9", "d20"}
    assert rej["d9"]["reason"] == "decontam.gsm8k-test" and rej["d9"]["contaminated_tasks"] == ["gsm8k-test", "cloze"]
    assert m.counts["rejected"] == {"decontam.gsm8k-test": 3}
    report = json.loads((tmp_path / "out" / "decontam.json").read_text())
    assert [(i["index"], i["line"], i["docs"]) for i in report["tasks"]["gsm8k-test"]["contaminated_items"]] == [(5, 6, 2), (33, 34, 1)]
    assert [i["index"] for i in report["tasks"]["cloze"]["contaminated_items"]] == [2]
    assert report["ngram"] == 13 and "digits kept" in report["normalization"]


# ---------------------------------------------------------------------------------------------
# clean text


@pytest.fixture(scope="module")
def crawl_docs(tmp_path_factory):
    if not (CRAWL / "planted.json").exists():
        pytest.skip("examples/crawl not generated")
    from llmctl.config import build_config
    from llmctl.data.crawl.extract import STAGE, ExtractConfig, run_crawl_extract

    out = tmp_path_factory.mktemp("crawl") / "docs"
    run_crawl_extract([str(CRAWL)], str(out), build_config(ExtractConfig, STAGE, str(ROOT / "stages/crawl-extract/default.toml")), RunOptions(workers=2))
    return out


def test_clean_crawl_has_no_gsm8k_test_overlap(crawl_docs, tmp_path):
    """The example crawl's ~150 math pages hold GSM8K-style problems made from templates, never
    GSM8K test questions: at 13 words nothing matches."""
    gsm, _ = gsm8k_test()
    m = run([crawl_docs], [gsm], tmp_path / "r13", workers=2, report_only=True)
    assert m.counts["in"] > 1000 and m.counts["contaminated"] == 0
    assert m.counts["tasks"]["gsm8k-test"]["ngrams_matched"] == 0
    # 8 words let a template phrase collide ("works 5 hours a day for 4 days"): the false
    # positive Llama 3 accepted; asking two shared n-grams per item removes it
    m8 = run([crawl_docs], [gsm], tmp_path / "r8", workers=2, report_only=True, ngram=8)
    assert m8.counts["tasks"]["gsm8k-test"]["items_contaminated"] <= 1
    m8b = run([crawl_docs], [gsm], tmp_path / "r8b", workers=2, report_only=True, ngram=8, min_overlap=2)
    assert m8b.counts["contaminated"] == 0


# ---------------------------------------------------------------------------------------------
# report-only, CLI, errors, empty input, workers, streaming, resume


def test_report_only_writes_no_docs(canaries, tmp_path):
    docs, gsm, _ = canaries
    m = run([docs], [gsm], tmp_path / "out", report_only=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")) == ["decontam.json", "manifest.json"]
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert man["kind"] == "decontam-report" and [o["file"] for o in man["outputs"]] == ["decontam.json"]
    assert m.counts["contaminated"] == 3 and "out" not in m.counts
    # no -o at all: nothing written, the figures come back
    m2 = run([docs], [gsm], None, report_only=True)
    assert m2.counts["tasks"] == m.counts["tasks"]


def test_cli_report_only_prints_and_json(canaries, tmp_path):
    docs, gsm, _ = canaries
    p = llmctl("decontam", docs, "--against", gsm, "--report-only", "--workers", "1")
    assert p.returncode == 0, p.stderr.decode()
    err = p.stderr.decode()
    assert "contamination per task" in err and "gsm8k-test" in err and "1,319" in err and p.stdout == b""
    p = llmctl("decontam", docs, "--against", gsm, "--report-only", "-o", "-", "--workers", "1")
    report = json.loads(p.stdout)
    assert report["tasks"]["gsm8k-test"]["items_contaminated"] == 2
    p = llmctl("decontam", docs, "--against", f"g8={gsm}", "--ngram", "8", "-o", tmp_path / "o", "--json", "--workers", "1")
    summary = json.loads(p.stdout)
    assert summary["counts"]["contaminated"] == 4 and summary["counts"]["tasks"]["g8"]["items_contaminated"] == 3


def test_cli_help_explains_flags():
    out = llmctl("decontam", "--help").stdout.decode()
    for flag in ("--against", "--output", "--ngram", "--min-overlap", "--flag", "--report-only", "--report", "--threshold", "--keep-rejected", "--workers"):
        assert flag in out


def test_cli_malformed_task_file_names_the_line(canaries, tmp_path):
    docs, _, _ = canaries
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "b"}\n{"question": "c", "answer": "d"}\n{"question": oops}\n')
    p = llmctl("decontam", docs, "--against", bad, "-o", tmp_path / "o")
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "bad.jsonl:3: not valid JSON" in err
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"question": "q", "answer": "a"}, {"label": 1}])
    p = llmctl("decontam", docs, "--against", odd, "-o", tmp_path / "o")
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "odd.jsonl:2: no eval text found" in err
    p = llmctl("decontam", docs, "-o", tmp_path / "o")
    assert p.returncode == 2 and "--against" in p.stderr.decode()
    # a task file given as a docs input (shell-expanded glob after --against) gets a hint
    good = write_jsonl(tmp_path / "good.jsonl", [{"question": "q", "answer": "a"}])
    p = llmctl("decontam", docs, good, "--against", good, "-o", tmp_path / "o")
    err = p.stderr.decode()
    assert p.returncode == 2 and "good.jsonl: no 'text' column" in err and "--against" in err


def test_empty_inputs(tmp_path):
    _, recs = gsm8k_test()
    gsm = write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [{k: recs[0][k] for k in ("question", "answer")}])
    empty_docs = write_docs(tmp_path / "in" / "empty.parquet", [])
    m = run([empty_docs], [gsm], tmp_path / "out")
    assert (m.counts["in"], m.counts["out"], m.counts["contaminated"]) == (0, 0, 0)
    assert read_rows(tmp_path / "out") == [] and (tmp_path / "out" / "part-00000.parquet").exists()
    assert m.counts["tasks"]["gsm8k-test"]["items_contaminated"] == 0
    empty_task = tmp_path / "none.jsonl"
    empty_task.write_text("\n")
    with pytest.raises(UsageError, match="holds no items"):
        run([empty_docs], [empty_task], tmp_path / "out2")
    with pytest.raises(UsageError, match="no task file matches"):
        run([empty_docs], [tmp_path / "nope-*.jsonl"], tmp_path / "out3")


def test_workers_streaming_and_resume_agree(canaries, tmp_path):
    docs, gsm, _ = canaries
    rows = pq.read_table(docs).to_pylist()
    parts = [write_docs(tmp_path / "multi" / f"p{i}.parquet", rows[i::3]) for i in range(3)]
    m1 = run([tmp_path / "multi"], [gsm], tmp_path / "w1", workers=1)
    m3 = run([tmp_path / "multi"], [gsm], tmp_path / "w3", workers=3)
    assert m1.counts == m3.counts and len(parts) == 3
    for a, b in zip(sorted((tmp_path / "w1").glob("part-*")), sorted((tmp_path / "w3").glob("part-*"))):
        assert a.read_bytes() == b.read_bytes()
    again = run([tmp_path / "multi"], [gsm], tmp_path / "w1", workers=2)  # resume: every shard done
    assert again.counts == m1.counts
    p = llmctl("decontam", tmp_path / "multi", "--against", gsm, "-o", "-", "-q")
    assert p.returncode == 0, p.stderr.decode()
    streamed = ipc.open_stream(p.stdout).read_all().to_pylist()
    assert [r["id"] for r in streamed] == [r["id"] for r in read_rows(tmp_path / "w1")]
    # a different task set into the same OUT is refused, not mixed
    other = write_jsonl(tmp_path / "other.jsonl", [{"question": "q w e r t y", "answer": "1"}])
    with pytest.raises(UsageError, match="different"):
        run([tmp_path / "multi"], [other], tmp_path / "w1")
