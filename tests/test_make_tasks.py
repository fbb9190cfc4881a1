"""Tests of examples/make_tasks.py, the generator of the demo eval tasks in examples/tasks.

The committed task files must regenerate byte for byte, follow the schemas `llmctl eval` reads
(generic multiple choice, GSM8K), and be held out from the example crawl. The crawl is read here
independently of the generator: WARC payloads (tags stripped, entities unescaped) and the texts
planted.json records.
"""
import html
import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "make_tasks.py"
TASKS = ROOT / "examples" / "tasks"
CRAWL = ROOT / "examples" / "crawl"
FILES = ("cloze.jsonl", "arithmetic.jsonl", "arithmetic-train.jsonl", "arithmetic-sft.jsonl", "arithmetic-corpus.jsonl",
         "arithmetic-pairs.jsonl")


def load_generator():
    spec = importlib.util.spec_from_file_location("make_tasks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def gen():
    return load_generator()


@pytest.fixture(scope="module")
def regenerated(gen, tmp_path_factory):
    out = tmp_path_factory.mktemp("tasks")
    return out, gen.generate(out)


@pytest.fixture(scope="module")
def cloze():
    return read_jsonl(TASKS / "cloze.jsonl")


@pytest.fixture(scope="module")
def arith():
    return read_jsonl(TASKS / "arithmetic.jsonl"), read_jsonl(TASKS / "arithmetic-train.jsonl")


@pytest.fixture(scope="module")
def crawl_texts():
    """(documents of the crawl as text, planted.json)."""
    planted = json.loads((CRAWL / "planted.json").read_text(encoding="utf-8"))
    docs = []
    for name in planted["files"]:
        with open(CRAWL / name, "rb") as f:
            for rec in ArchiveIterator(f):
                if rec.rec_type == "response":
                    body = rec.content_stream().read()
                    text = body.decode("cp1252" if b"windows-1252" in body[:1000] else "utf-8", errors="replace")
                    docs.append(html.unescape(re.sub(r"<[^>]*>", "\n", text)))
    docs += [e[k] for e in planted["captures"] for k in ("body_text", "sentence") if e.get(k)]
    return docs, planted


def norm_words(text):
    return re.sub(r"[^\w\s]|_", " ", text.lower()).split()


# ----------------------------------------------------------------------------- reproducible
def test_regenerates_committed_files_byte_for_byte(regenerated):
    out, counts = regenerated
    assert counts == {"cloze.jsonl": 200, "arithmetic.jsonl": 300, "arithmetic-train.jsonl": 1200, "arithmetic-sft.jsonl": 1200,
                      "arithmetic-corpus.jsonl": 1000, "arithmetic-pairs.jsonl": 64}
    for name in FILES:
        assert (TASKS / name).is_file(), f"examples/tasks/{name} is missing: run examples/make_tasks.py"
        assert (out / name).read_bytes() == (TASKS / name).read_bytes(), f"{name} differs: rerun examples/make_tasks.py and commit"
    assert (TASKS / "README.md").is_file()


def test_refuses_the_crawls_seed(gen, tmp_path):
    seed = json.loads((CRAWL / "planted.json").read_text(encoding="utf-8"))["seed"]
    with pytest.raises(SystemExit, match="must differ"):
        gen.generate(tmp_path, seed=seed)


# ----------------------------------------------------------------------------- schemas
def test_cloze_schema(cloze):
    assert len(cloze) == 200
    for n, it in enumerate(cloze, 1):
        assert list(it) == ["context", "choices", "label"], n
        ctx, choices, label = it["context"], it["choices"], it["label"]
        assert isinstance(ctx, str) and ctx == ctx.strip() and len(ctx.split()) >= 4, n
        assert isinstance(choices, list) and len(choices) == 4 and all(isinstance(c, str) for c in choices), n
        assert type(label) is int and 0 <= label < 4, n
        # the harness convention: the continuation starts with one space
        assert all(c.startswith(" ") and not c.startswith("  ") and c.strip() for c in choices), n
        answer = choices[label].strip().lower()
        assert [c.strip().lower() for c in choices].count(answer) == 1, n
        assert len({c.strip().lower() for c in choices}) == 4, n
        assert 2 <= len(choices[label].split()) <= 5, n
        assert all(len(c.split()) == len(choices[label].split()) for c in choices), n  # distractors of the same length
    assert Counter(it["label"] for it in cloze) == {0: 50, 1: 50, 2: 50, 3: 50}
    assert len({it["context"] + it["choices"][it["label"]] for it in cloze}) == len(cloze)


ARITH = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}


def test_arithmetic_schema_and_answers(arith):
    test, train = arith
    assert (len(test), len(train)) == (300, 1200)
    for items in (test, train):
        for n, it in enumerate(items, 1):
            assert list(it) == ["question", "answer"], n
            assert it["question"].endswith("?"), n
            *solution, last = it["answer"].split("\n")
            m = re.fullmatch(r"#### (-?\d+)", last)
            assert m and solution, f"{n}: {it['answer']!r}"
            answer = int(m.group(1))
            steps = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", "\n".join(solution))
            assert steps, n
            for a, op, b, c in steps:  # every step's arithmetic is right
                assert ARITH[op](int(a), int(b)) == int(c), f"{n}: {a} {op} {b} = {c}"
            assert int(steps[-1][3]) == answer, n  # and the answer is the last step's result
    questions = [it["question"] for it in test + train]
    assert len(set(questions)) == len(questions), "arithmetic.jsonl and arithmetic-train.jsonl overlap or repeat"



def test_arithmetic_steps_are_one_digit_facts(arith):
    """small=True: each step combines a number with a digit (2 * 3, 42 / 6, 9 - 4, 42 + 5), never two
    multi-digit numbers, so the facts are ones a 2M-parameter model can know."""
    for items in arith:
        for it in items:
            for a, op, b, c in re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", it["answer"]):
                assert min(int(a), int(b)) <= 9 or op == "-" and int(c) <= 9, it["answer"]
                assert int(c) <= 90, it["answer"]


def test_sft_chats_end_half_in_a_check_line(arith):
    """arithmetic-sft.jsonl is arithmetic-train.jsonl with a seeded half of its `#### N` lines replaced
    by a true check of the last step whose last number is not N: both endings are learned, one is read."""
    _, train = arith
    sft = read_jsonl(TASKS / "arithmetic-sft.jsonl")
    assert [it["question"] for it in sft] == [it["question"] for it in train]
    checked = 0
    for it, gold in zip(sft, train):
        if it["answer"] == gold["answer"]:
            continue
        checked += 1
        body, last = it["answer"].rsplit("\n", 1)
        assert body == gold["answer"].rsplit("\n", 1)[0] and "####" not in it["answer"]
        m = re.fullmatch(r"Check: (\d+) ([-+*/]) (\d+) = (\d+)\.", last)
        assert m, last
        c, op, b, a = m.groups()
        assert ARITH[op](int(c), int(b)) == int(a)  # true
        answer = gold["answer"].rsplit("#### ", 1)[1]
        assert c == answer and a != answer  # it checks the answer, and ends in another number
    assert checked == len(train) // 2


def test_verify_refuses_a_check_line_that_ends_in_the_answer(gen):
    crawl = gen.Crawl(CRAWL)
    gold = dict(question="How many?", answer="The barge carries 7 * 4 = 28 eggs.\n#### 28")
    bad = dict(gold, answer="The barge carries 7 * 4 = 28 eggs.\nCheck: 7 * 4 = 28.")
    with pytest.raises(SystemExit, match="check line"):
        gen.verify([], [], [gold], [bad], crawl)
    gen.verify([], [], [gold], [dict(gold, answer="The barge carries 7 * 4 = 28 eggs.\nCheck: 28 / 4 = 7.")], crawl)


def test_task_files_load_in_llmctl_eval():
    tasks = pytest.importorskip("llmctl.eval.tasks")
    mc = tasks.load_items(tasks.parse_task(f"mc:{TASKS / 'cloze.jsonl'}"))
    assert len(mc) == 200 and all(len(i.pairs) == 4 for i in mc)
    gsm = tasks.load_items(tasks.parse_task(f"gsm8k:{TASKS / 'arithmetic.jsonl'}"))
    assert len(gsm) == 300 and all(re.fullmatch(r"\d+", i.target) for i in gsm)


# ----------------------------------------------------------------------------- held out
def test_cloze_sentences_are_not_in_the_crawl(cloze, crawl_texts):
    docs, _ = crawl_texts
    text = "\n\n".join(docs)
    for n, it in enumerate(cloze, 1):
        sentence = it["context"] + it["choices"][it["label"]]
        assert sentence not in text, f"cloze.jsonl:{n} is in the crawl: {sentence!r}"


def test_cloze_shares_no_13gram_with_the_crawl(cloze, crawl_texts):
    """The rule of `llmctl decontam` (13-grams; a shorter passage as one run of all its words),
    for every passage context + choice, right or wrong."""
    docs, _ = crawl_texts
    doc_words = [norm_words(d) for d in docs]
    grams = {tuple(w[i:i + 13]) for w in doc_words for i in range(len(w) - 12)}
    runs = " " + " | ".join(" ".join(w) for w in doc_words) + " "
    for n, it in enumerate(cloze, 1):
        for c in it["choices"]:
            w = norm_words(it["context"] + c)
            if len(w) < 13:
                assert f" {' '.join(w)} " not in runs, f"cloze.jsonl:{n}: {it['context'] + c!r} is in the crawl"
            else:
                assert not any(tuple(w[i:i + 13]) in grams for i in range(len(w) - 12)), f"cloze.jsonl:{n}: {it['context'] + c!r} shares a 13-gram"


def test_cloze_is_of_the_crawls_world(gen, cloze, crawl_texts):
    """Held out, yet about the same places: most items name a town the crawl writes about."""
    _, planted = crawl_texts
    text = " ".join(e["body_text"] or "" for e in planted["captures"])
    towns = set(re.findall(r"\b[A-Z][a-z]+(?:" + "|".join(gen.mc.TOWN_B) + r")\b", text))
    assert len(towns) >= 30
    named = sum(any(t in it["context"] + " ".join(it["choices"]) for t in towns) for it in cloze)
    assert named >= len(cloze) // 2


def test_arithmetic_questions_are_not_planted(arith, crawl_texts):
    docs, planted = crawl_texts
    text = "\n\n".join(docs)
    planted_qs = {" ".join(p["question"].lower().split()) for p in planted["problems"]}
    assert len(planted_qs) > 500
    for items in arith:
        for n, it in enumerate(items, 1):
            assert " ".join(it["question"].lower().split()) not in planted_qs, f"{n}: {it['question']!r} is a planted problem"
            assert it["question"] not in text, n


def test_verify_fails_loudly_on_a_leak(gen, crawl_texts):
    """A sentence taken from the crawl, or a planted problem, makes the script refuse to write."""
    _, planted = crawl_texts
    crawl = gen.Crawl(CRAWL)
    sentence = next(e["sentence"] for e in planted["captures"] if e["category"] == "article" and e["lang"] == "en" and e["sentence"])
    w = sentence.split(" ")
    leaky = dict(context=" ".join(w[:-3]), choices=[" " + " ".join(w[-3:]), " one two three.", " four five six.", " seven eight nine."], label=0)
    with pytest.raises(SystemExit, match="sentence is in the crawl"):
        gen.verify([leaky], [], [], [], crawl)
    p = planted["problems"][0]
    with pytest.raises(SystemExit, match="planted in the crawl"):
        gen.verify([], [dict(question=p["question"], answer=p["solution"])], [], [], crawl)


def test_midtraining_corpus_holds_no_eval_question_and_right_arithmetic(arith):
    test, _ = arith
    docs = [json.loads(line) for line in (TASKS / "arithmetic-corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(docs) == 1000 and len({d["id"] for d in docs}) == 1000
    questions = [q for d in docs for q in re.findall(r"Question: (.+)", d["text"])]
    assert len(questions) == 4000 == len(set(questions))
    assert not set(questions) & {it["question"] for it in test}
    for d in docs:
        for a, op, b, c in re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", d["text"]):
            assert ARITH[op](int(a), int(b)) == int(c), d["id"]


def test_pairs_prefer_the_gold_total_over_a_wrong_one():
    pairs = [json.loads(line) for line in (TASKS / "arithmetic-pairs.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (TASKS / "arithmetic-train.jsonl").read_text().splitlines()][: len(pairs)]
    assert len(pairs) == 64
    for p, t in zip(pairs, train):
        assert p["prompt"] == t["question"] and p["chosen"] == t["answer"]
        steps, total = p["rejected"].rsplit("#### ", 1)
        assert steps == t["answer"].rsplit("#### ", 1)[0] and int(total) == int(t["answer"].rsplit("#### ", 1)[1]) + 1
