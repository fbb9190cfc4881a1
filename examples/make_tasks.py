"""Generate the demo eval task files from the example crawl's generator, held out from the crawl.

    python examples/make_tasks.py [--out examples/tasks] [--crawl examples/crawl] [--seed 2025]

Writes five files (see examples/tasks/README.md):

* `cloze.jsonl`: multiple-choice cloze items `{"context", "choices", "label"}` (the generic `mc:`
  schema of `llmctl eval`). Each item is one fresh sentence written by make_crawl's own article
  generator (`build_article`, i.e. its grammar and sentence forms) about the crawl's own world
  (`build_world` with the crawl's seed, read from planted.json, so the towns, rivers, people and
  their facts are the ones the crawl describes), but drawn with another random seed. The context
  is the sentence without its last 2-5 words; the right choice is those words (with a leading
  space, the lm-evaluation-harness convention); the three distractors are endings of the same
  number of words cut from other generated sentences.
* `arithmetic.jsonl` / `arithmetic-train.jsonl`: GSM8K-format items `{"question", "answer"}`
  ("...\\n#### N") from make_crawl's word-problem generator (`problem`) under another seed: the
  eval set and a disjoint set for few-shot examples or RL prompts.
* `arithmetic-corpus.jsonl`: the demo's midtraining corpus, docs `{"id", "text"}`: 1,000
  worksheets of 4 worked problems each (question and solution steps, no `#### n` line), under
  another seed.

Held out, and checked here (the script fails rather than write a leaky file):
* the crawl is read back from its WARC files (whose sha256 must match planted.json), plus the
  texts planted.json records; every HTML/text payload is decoded, tags stripped, entities unescaped;
* no cloze sentence occurs in any crawl document, verbatim or after normalization; moreover no
  passage `context + choice` (right or wrong) shares a word 13-gram with the crawl, and a passage
  shorter than 13 words does not occur in it as a run of words: the criterion of `llmctl
  decontam` (GPT-3's), so decontaminating the crawl against this task removes nothing;
* exactly one choice is right: a wrong choice never completes its context into a sentence the
  generator wrote, one the crawl contains, or one make_crawl's grammar could write about the same
  subject (every alternative of every sentence form, filled with the subject's facts and with
  each of its town's events, people and animals; people's names count as interchangeable), so
  distractors that are wrong only by a free choice of the grammar are never used;
* no arithmetic question equals a problem planted in the crawl (planted.json "problems") or
  occurs in a crawl document; eval and train sets share no question; the midtraining corpus
  holds no eval question.

Byte-for-byte reproducible: seeded random.Random instances only; sets serve membership tests,
never an order. Only the standard library, warcio and examples/make_crawl.py are used.
"""
import argparse
import hashlib
import html
import json
import random
import re
import sys
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_crawl as mc  # noqa: E402  (the crawl's generator: world, grammar, word problems)

N_CLOZE, N_ARITH, N_ARITH_TRAIN = 200, 300, 1200  # n = 300 held out: a paired 10-point gap is ~3 standard errors
N_CORPUS_DOCS, PER_DOC = 1000, 4  # the midtraining corpus: worksheets of worked problems
NGRAM = 13  # llmctl decontam's default (GPT-3)
POOL = 2000  # generated sentences that pass the held-out checks, the pool items and distractors come from
MIN_CONTEXT = 4  # words left in a context
FILES = ("cloze.jsonl", "arithmetic.jsonl", "arithmetic-train.jsonl", "arithmetic-sft.jsonl", "arithmetic-corpus.jsonl",
         "arithmetic-pairs.jsonl")
N_PAIRS = 64  # preference pairs: what the smoke run's dpo and train-rm read (examples/ci/smoke.sh)
INVERSE = {"*": "/", "/": "*", "+": "-", "-": "+"}  # the check of a op b = c is c inv b = a
EQUATION = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
ARITH = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}


# ----------------------------------------------------------------------------- the crawl's text
def words(text):
    """Words as `llmctl decontam` compares them: lowercase, punctuation stripped, digits kept."""
    return re.sub(r"[^\w\s]|_", " ", text.lower()).split()


class Crawl:
    """Every text of the example crawl: payloads of its WARC records, planted texts, planted problems."""

    def __init__(self, crawl_dir):
        crawl_dir = Path(crawl_dir)
        self.planted = json.loads((crawl_dir / "planted.json").read_text(encoding="utf-8"))
        self.docs = []
        for name in mc.FILES:
            data = (crawl_dir / name).read_bytes()
            if hashlib.sha256(data).hexdigest() != self.planted["files"][name]:
                raise SystemExit(f"make_tasks: {crawl_dir / name} does not match planted.json: regenerate the crawl first")
            with open(crawl_dir / name, "rb") as f:
                for rec in ArchiveIterator(f):
                    if rec.rec_type != "response":
                        continue
                    body = rec.content_stream().read()  # de-chunked, gzip decoded
                    charset = "cp1252" if b"windows-1252" in body[:1000] else "utf-8"
                    text = body.decode(charset, errors="replace")
                    self.docs.append(html.unescape(re.sub(r"<[^>]*>", "\n", text)))
        for e in self.planted["captures"]:
            self.docs += [e[k] for k in ("body_text", "sentence") if e.get(k)]
        self.docs += [p["question"] + "\n" + p["solution"] for p in self.planted["problems"]]
        self.text = "\n\n".join(self.docs)  # for "does this sentence occur verbatim anywhere"
        doc_words = [words(d) for d in self.docs]
        self.grams = {tuple(w[i:i + NGRAM]) for w in doc_words for i in range(len(w) - NGRAM + 1)}
        self.runs = " " + " | ".join(" ".join(w) for w in doc_words) + " "  # word runs; " | " stops a run at a document's end
        self.problems = {p["question"] for p in self.planted["problems"]}

    def contains(self, passage):
        """True when the passage overlaps the crawl by llmctl decontam's rule, or occurs in it verbatim."""
        if passage in self.text:
            return True
        w = words(passage)
        if len(w) < NGRAM:
            return bool(w) and f" {' '.join(w)} " in self.runs
        return any(tuple(w[i:i + NGRAM]) in self.grams for i in range(len(w) - NGRAM + 1))


def crawl_world(crawl):
    """The crawl's world: build_world is the first thing make_crawl draws from its seeded rng."""
    world = mc.build_world(random.Random(crawl.planted["seed"]))
    missing = [t["T"] for t in world["towns"] if t["T"] not in crawl.text]
    if missing:
        raise SystemExit(f"make_tasks: the rebuilt world is not the crawl's (towns {missing[:5]} are not in it): make_crawl.py changed?")
    return world


# ----------------------------------------------------------------------------- cloze
class recording_say:
    """Within the block, remember the slots (ctx) each sentence of make_crawl's grammar was filled from."""

    def __init__(self):
        self.ctx, self._say = {}, mc.say

    def __enter__(self):
        def say(rng, template, ctx):
            s = self._say(rng, template, ctx)
            self.ctx[s] = ctx
            return s
        mc.say = say  # realize() and build_article() look `say` up in make_crawl's globals
        return self

    def __exit__(self, *exc):
        mc.say = self._say


def sentence_pool(rng, world, crawl):
    """Fresh sentences from make_crawl's article generator; those the crawl holds are dropped.
    Returns (held-out sentences in generation order, every sentence generated, sentence -> slots)."""
    kinds = [k for k, n in mc.ARTICLE_KINDS.items() for _ in range(n)]
    pool, seen = [], {}
    with recording_say() as rec:
        while len(pool) < POOL:
            kind = rng.choice(kinds)
            art = mc.build_article(rng, world, kind, mc.pick_subject(rng, world, kind))
            for block, sents in art["blocks"]:
                if block != "p":
                    continue
                for s in sents:
                    if s in seen:
                        continue
                    seen[s] = True
                    if len(s.split()) >= MIN_CONTEXT + 2 and not re.search(r"[.!?]\"? ", s) and not crawl.contains(s):
                        pool.append(s)
    return pool, seen, rec.ctx


def expand(template):
    """Every way to resolve a form's [a|b] alternatives (make_crawl.say picks one at random)."""
    m = mc.ALT.search(template)
    if not m:
        return [template]
    return [x for alt in m.group(1).split("|") for x in expand(template[:m.start()] + alt + template[m.end():])]


FORMS = [e for table in (mc.EN, mc.EN_ANIMAL, mc.EN_FOOD, mc.EN_EVENT, mc.EN_RIVER, mc.EN_CRAFT) for forms in table.values()
         for f in forms for e in expand(f)] + [e for f in mc.EN_CMP for e in expand(f)]
NAMES = re.compile(r"\b(?:%s)(?: (?:%s))?\b" % ("|".join(mc.FEMALE + mc.MALE), "|".join(mc.SURNAMES)))


def unname(sentence):
    """People's names are interchangeable in the grammar: two sentences that differ only in a name are the same."""
    return NAMES.sub("<name>", sentence)


class Grammar:
    """Which sentences make_crawl's grammar can write about a subject: a wrong choice must not be one."""

    def __init__(self, world):
        self.towns = {t["T"]: t for t in world["towns"]}
        self.people = world["people"]

    def variants(self, ctx):
        """The subject's slots, and the same with each of its town's events, its town's people and every
        animal: facts an article may pick among, so a sentence about any of them is true."""
        out = [ctx]
        town = self.towns.get(ctx.get("T"))
        if town:
            out += [ctx | mc.event_ctx(town, e) for e in town["events"]]
            out += [ctx | mc.person_ctx(p) for p in self.people if p["town"] is town]
            for a in mc.ANIMALS:
                v = ctx | {k: x for k, x in mc.town_ctx(town | dict(animal=a)).items() if k in ("an", "ans", "Ans", "a_an", "hab", "diet", "weight", "life", "active", "young")}
                if "count" in ctx:  # an animal article's counts, as build_article makes them
                    v |= dict(count=mc.fixed(a[0] + town["R"], 6, 180), since=mc.fixed(a[0] + town["R"], 1975, 2015),
                              trend=["risen", "grown slowly", "fallen"][mc.fixed(a[1] + town["R"], 0, 2)])
                out.append(v)
        return out

    def sentences(self, ctx, context):
        """Every sentence the grammar can write from ctx that starts with context, names masked."""
        out = set()
        variants = self.variants(ctx)
        for form in FORMS:
            head = form.split("{", 1)[0]
            head = head[:1].upper() + head[1:]
            if not (context.startswith(head) or head.startswith(context)):
                continue
            for v in variants:
                try:
                    if "{quote}" in form:
                        fills = [dict(quote=q.format_map(v)) for q in mc.QUOTES]
                    elif "{opinion}" in form:
                        fills = [dict(opinion=o.format_map(v)) for o in mc.OPINIONS]
                    elif "{equote}" in form:
                        fills = [dict(equote=q.format_map(v)) for q in mc.EQUOTES]
                    else:
                        fills = [{}]
                    for fill in fills:
                        s = form.format_map(v | fill)
                        s = s[:1].upper() + s[1:]
                        if s.startswith(context):
                            out.add(unname(s))
                except KeyError:  # a form for another kind of subject
                    continue
        return out


def cut(rng, sentence):
    w = sentence.split(" ")
    k = rng.randint(2, min(5, len(w) - MIN_CONTEXT))
    return " ".join(w[:-k]), " " + " ".join(w[-k:]), k


def cloze_items(rng, world, crawl):
    pool, generated, slots = sentence_pool(rng, world, crawl)
    grammar = Grammar(world)
    endings = {}  # words in the ending -> endings of the pool's sentences, in pool order, unique
    for s in pool:
        w = s.split(" ")
        for k in range(2, 6):
            if len(w) - k >= MIN_CONTEXT:
                endings.setdefault(k, {})[" " + " ".join(w[-k:])] = True
    endings = {k: list(v) for k, v in endings.items()}
    order = list(range(len(pool)))
    rng.shuffle(order)
    labels = [i % 4 for i in range(N_CLOZE)]  # each position equally often
    rng.shuffle(labels)
    items = []
    for i in order:
        if len(items) == N_CLOZE:
            break
        context, answer, k = cut(rng, pool[i])
        if pool[i] not in slots:
            raise SystemExit(f"make_tasks: no slots recorded for {pool[i]!r}: make_crawl.py changed?")
        valid = grammar.sentences(slots[pool[i]], context)
        if unname(pool[i]) not in valid:
            raise SystemExit(f"make_tasks: the grammar does not rebuild {pool[i]!r}: make_crawl.py changed?")

        def ok(d):
            return (d.strip().lower() != answer.strip().lower() and d[-1] == answer[-1] and d.count('"') == answer.count('"')
                    and 0.6 <= len(d) / len(answer) <= 1.67  # similar length, same closing punctuation and quotes
                    and context + d not in generated and unname(context + d) not in valid and not crawl.contains(context + d))

        distractors = []
        for d in rng.sample(endings[k], len(endings[k])):
            if ok(d) and all(d.strip().lower() != x.strip().lower() for x in distractors):
                distractors.append(d)
                if len(distractors) == 3:
                    break
        if len(distractors) < 3:
            continue
        label = labels[len(items)]
        choices = distractors[:label] + [answer] + distractors[label:]
        items.append(dict(context=context, choices=choices, label=label))
    if len(items) < N_CLOZE:
        raise SystemExit(f"make_tasks: only {len(items)} cloze items could be made")
    return items


# ----------------------------------------------------------------------------- arithmetic
def arithmetic_items(rng, world, crawl):
    """GSM8K-format problems from make_crawl's generator with one-digit facts (small=True): (eval
    items, train items), disjoint."""
    out, seen = [], set()
    while len(out) < N_ARITH + N_ARITH_TRAIN:
        question, solution, _ = mc.problem(rng, world, small=True)
        key = " ".join(question.lower().split())
        if key in seen or question in crawl.problems or question in crawl.text:
            continue
        seen.add(key)
        out.append(dict(question=question, answer="\n".join(solution)))
    return out[:N_ARITH], out[N_ARITH:]


def check_line(answer):
    """The last step checked backwards, `Check: c inv b = a.`: a true line whose last number is not the answer."""
    a, op, b, c = EQUATION.findall(answer)[-1]
    return f"Check: {c} {INVERSE[op]} {b} = {a}."


def sft_items(rng, train):
    """The train problems as SFT chats, a seeded half ending in a check line instead of `#### n`: two
    behaviours the model learns, one of which the verifier can read (the demo's RL chooses between them)."""
    checked = set(rng.sample(range(len(train)), len(train) // 2))
    return [dict(it, answer=it["answer"].rsplit("\n", 1)[0] + "\n" + check_line(it["answer"])) if i in checked else it
            for i, it in enumerate(train)]


def pair_items(train, n=N_PAIRS):
    """Preference pairs over the first n train problems: chosen, the gold solution; rejected, the
    same steps ending in a wrong total (`#### n+1`), the one mistake the math verifier sees."""
    out = []
    for it in train[:n]:
        steps, total = it["answer"].rsplit("#### ", 1)
        out.append(dict(prompt=it["question"], chosen=it["answer"], rejected=f"{steps}#### {int(total) + 1}"))
    return out


def corpus_docs(rng, world, crawl, held_out):
    """The midtraining corpus: documents `{id, text}`, each a worksheet of PER_DOC worked problems
    ("Question: …\nAnswer: " and the solution's steps), drawn from the same generator under their
    own seed; no question of the eval set, the crawl or another worksheet. The steps state the
    one-digit facts and how they combine; the `#### n` answer line is left out, so the corpus
    teaches the arithmetic, not the answer format SFT teaches and RL chooses."""
    seen, docs = {" ".join(q.lower().split()) for q in held_out}, []
    while len(docs) < N_CORPUS_DOCS:
        sheet = []
        while len(sheet) < PER_DOC:
            question, solution, _ = mc.problem(rng, world, small=True)
            key = " ".join(question.lower().split())
            if key in seen or question in crawl.problems or question in crawl.text:
                continue
            seen.add(key)
            sheet.append(f"Question: {question}\nAnswer: " + "\n".join(solution[:-1]))  # the steps, not the '#### n' line
        docs.append({"id": f"arith-{len(docs):05d}", "text": "\n\n".join(sheet)})
    return docs


# ----------------------------------------------------------------------------- checks
def verify(cloze, arith, train, sft, crawl, corpus=()):
    """Fail loudly if an item leaked from the crawl or breaks its schema."""
    bad = []
    eval_questions = {it["question"] for it in arith}
    for n, doc in enumerate(corpus, 1):
        bad += [f"arithmetic-corpus.jsonl:{n}: holds the eval question {q!r}" for q in re.findall(r"Question: (.+)", doc["text"])
                if q in eval_questions]
    for n, it in enumerate(cloze, 1):
        choices, label = it["choices"], it["label"]
        sentence = it["context"] + choices[label]
        if len(choices) != 4 or not 0 <= label < 4 or len({c.strip().lower() for c in choices}) != 4:
            bad.append(f"cloze.jsonl:{n}: needs 4 distinct choices and a label in 0..3")
        if not all(c.startswith(" ") and not c.startswith("  ") for c in choices):
            bad.append(f"cloze.jsonl:{n}: a choice does not start with one space")
        if any(sentence in d for d in crawl.docs) or crawl.contains(sentence):
            bad.append(f"cloze.jsonl:{n}: the sentence is in the crawl: {sentence!r}")
        bad += [f"cloze.jsonl:{n}: choice {j} overlaps the crawl: {it['context'] + c!r}" for j, c in enumerate(choices) if crawl.contains(it["context"] + c)]
    questions = {}
    for name, items in (("arithmetic.jsonl", arith), ("arithmetic-train.jsonl", train)):
        for n, it in enumerate(items, 1):
            q = it["question"]
            if q in crawl.problems or q in crawl.text:
                bad.append(f"{name}:{n}: the question is planted in the crawl: {q!r}")
            if q in questions:
                bad.append(f"{name}:{n}: the question repeats {questions[q]}")
            questions[q] = f"{name}:{n}"
            final = re.fullmatch(r"(?s)(.+)\n#### (\d+)", it["answer"])
            steps = EQUATION.findall(final.group(1)) if final else []
            if not steps or int(final.group(2)) != int(steps[-1][3]):
                bad.append(f"{name}:{n}: the answer does not end in '#### N', N the result of the last step")
            bad += [f"{name}:{n}: wrong arithmetic {a} {op} {b} = {c}" for a, op, b, c in steps if ARITH[op](int(a), int(b)) != int(c)]
    for n, (it, gold) in enumerate(zip(sft, train), 1):
        if it["question"] != gold["question"]:
            bad.append(f"arithmetic-sft.jsonl:{n}: not the question of arithmetic-train.jsonl:{n}")
        elif it["answer"] != gold["answer"]:
            steps = EQUATION.findall(it["answer"])
            answer = steps[-2][3] if len(steps) > 1 else None
            if (len(steps) < 2 or "####" in it["answer"] or not it["answer"].endswith(".") or answer == steps[-1][3]
                    or gold["answer"] != it["answer"].rsplit("\n", 1)[0] + f"\n#### {answer}"):
                bad.append(f"arithmetic-sft.jsonl:{n}: a changed answer must be the gold one with a check line for '#### N', ending in another number")
            bad += [f"arithmetic-sft.jsonl:{n}: wrong arithmetic {a} {op} {b} = {c}" for a, op, b, c in steps if ARITH[op](int(a), int(b)) != int(c)]
    if bad:
        raise SystemExit("make_tasks: refusing to write leaky or malformed tasks:\n  " + "\n  ".join(bad[:20]))


def write_jsonl(path, items):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")


def generate(out_dir, crawl_dir=HERE / "crawl", seed=2025):
    """Write the task files into out_dir; return {file name: item count}."""
    out_dir = Path(out_dir)
    crawl = Crawl(crawl_dir)
    if crawl.planted["seed"] in (seed, seed + 1, seed + 2):
        raise SystemExit(f"make_tasks: --seed {seed} must differ from the crawl's seed {crawl.planted['seed']} (and from it minus 1 and 2)")
    world = crawl_world(crawl)
    cloze = cloze_items(random.Random(seed), world, crawl)
    arith, train = arithmetic_items(random.Random(seed + 1), world, crawl)
    sft = sft_items(random.Random(seed + 2), train)
    corpus = corpus_docs(random.Random(seed + 3), world, crawl, [it["question"] for it in arith])
    verify(cloze, arith, train, sft, crawl, corpus)
    pairs = pair_items(train)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, items in zip(FILES, (cloze, arith, train, sft, corpus, pairs)):
        write_jsonl(out_dir / name, items)
        counts[name] = len(items)
    return counts


def main():
    ap = argparse.ArgumentParser(description="Write the demo eval tasks (held-out cloze, arithmetic word problems) made from the example crawl's generator.")
    ap.add_argument("--out", type=Path, default=HERE / "tasks", help="output directory (default: examples/tasks)")
    ap.add_argument("--crawl", type=Path, default=HERE / "crawl", help="the example crawl to hold out from (default: examples/crawl)")
    ap.add_argument("--seed", type=int, default=2025, help="seed of the cloze sentences; seed + 1 draws the problems, seed + 2 the SFT answers given a check line, seed + 3 the midtraining corpus (default 2025)")
    args = ap.parse_args()
    counts = generate(args.out, args.crawl, args.seed)
    print(f"wrote {', '.join(f'{n} ({c} items)' for n, c in counts.items())} to {args.out}")


if __name__ == "__main__":
    main()
