"""Hostile model directories (issue 30): a downloaded model folder is untrusted input. A tiny valid
Llama / SmolLM2 release, built by transformers itself (tests/test_hf_models.py), is corrupted one
thing per case — config values that are NaN, infinite, negative, of the wrong type or sizes that
overflow; a weight map naming an int, `../` or an absolute path, or a shard that is missing or not
a file; tokenizer and generation configs with wrong-typed fields; chat templates that loop over a
huge range, bomb the output, never end, recurse or raise — and `llmctl import` (and `llmctl
generate`, on an imported checkpoint whose files were then tampered) must end with exit 2 and one
line naming the file and the field: no traceback, no signal, no hang (each case runs under an
alarm), and nothing written."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from test_bad_input import cli, usage_error

transformers = pytest.importorskip("transformers")
from test_hf_models import build  # noqa: E402

TIMEOUT = 60  # s a case may take before it counts as a hang (each takes well under a second)


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """smollm2: one safetensors file and a ChatML template; llama2: seven shards and their index."""
    root = tmp_path_factory.mktemp("releases")
    return {name: build(name, root) for name in ("smollm2", "llama2")}


@pytest.fixture(scope="module")
def checkpoint(releases, tmp_path_factory):
    """smollm2 imported (a chat model: generate prompts it through its template)."""
    out = tmp_path_factory.mktemp("imported") / "ck"
    r = cli("import", releases["smollm2"], "-o", out, "--quiet", timeout=TIMEOUT)
    assert r.code == 0, r.why()
    return out


# -- corruptions: each a function of the model folder -------------------------------------------

def edit(name: str, **changes):
    """Set keys of a JSON file of the folder (a value None removes the key)."""
    def apply(folder):
        path = folder / name
        data = json.loads(path.read_text()) if path.is_file() else {}
        data.update(changes)
        path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    return apply


def write(name: str, data: bytes | str):
    def apply(folder):
        path = folder / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return apply


def template(source: str):
    return edit("tokenizer_config.json", chat_template=source)


def weight_map(change):
    """Change the shard index's weight_map: `change(old) -> new`."""
    def apply(folder):
        path = folder / "model.safetensors.index.json"
        index = json.loads(path.read_text())
        index["weight_map"] = change(index["weight_map"])
        path.write_text(json.dumps(index))
    return apply


def one_entry(value):
    return weight_map(lambda m: {**m, "model.norm.weight": value})


def replace_shard(make):
    """The shard holding model.norm.weight replaced by `make(path)`."""
    def apply(folder):
        shard = folder / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]["model.norm.weight"]
        shard.unlink()
        make(shard)
    return apply


NAN, INF = float("nan"), float("inf")

CONFIG = "config.json"
TOKCFG = "tokenizer_config.json"
GENCFG = "generation_config.json"
INDEX = "model.safetensors.index.json"

# id: (release, corruption, words the one line must hold)
IMPORT_CASES = {
    # config.json: values that are not finite, not positive, too large, or not of their type
    "eps-nan": ("smollm2", edit(CONFIG, rms_norm_eps=NAN), [CONFIG, "rms_norm_eps", "finite"]),
    "rope-theta-inf": ("smollm2", edit(CONFIG, rope_theta=INF), [CONFIG, "rope_theta", "finite"]),
    "rope-parameters-theta-nan": ("smollm2", edit(CONFIG, rope_parameters={"rope_type": "default", "rope_theta": NAN}),
                                  [CONFIG, "rope_parameters.rope_theta", "finite"]),
    "rope-theta-neg-inf": ("smollm2", edit(CONFIG, rope_theta=-INF), [CONFIG, "rope_theta"]),
    "rope-theta-negative": ("smollm2", edit(CONFIG, rope_theta=-10000.0), [CONFIG, "rope_theta"]),
    "layers-negative": ("smollm2", edit(CONFIG, num_hidden_layers=-1), [CONFIG, "num_hidden_layers"]),
    "hidden-zero": ("smollm2", edit(CONFIG, hidden_size=0), [CONFIG, "hidden_size"]),
    "ffn-overflow": ("smollm2", edit(CONFIG, intermediate_size=2 ** 62), [CONFIG, "intermediate_size"]),
    "ffn-2^70": ("smollm2", edit(CONFIG, intermediate_size=2 ** 70), [CONFIG, "intermediate_size"]),
    "vocab-overflow": ("smollm2", edit(CONFIG, vocab_size=10 ** 15), [CONFIG, "vocab_size"]),
    "context-huge": ("smollm2", edit(CONFIG, max_position_embeddings=10 ** 12), [CONFIG, "max_position_embeddings"]),
    "heads-huge": ("smollm2", edit(CONFIG, num_attention_heads=2 ** 40), [CONFIG, "num_attention_heads"]),
    "kv-heads-negative": ("smollm2", edit(CONFIG, num_key_value_heads=-2), [CONFIG, "num_key_value_heads"]),
    "head-dim-huge": ("smollm2", edit(CONFIG, head_dim=2 ** 40), [CONFIG, "head_dim"]),
    "hidden-string": ("smollm2", edit(CONFIG, hidden_size="64"), [CONFIG, "hidden_size", "integer"]),
    "layers-float": ("smollm2", edit(CONFIG, num_hidden_layers=2.5), [CONFIG, "num_hidden_layers", "integer"]),
    "layers-bool": ("smollm2", edit(CONFIG, num_hidden_layers=True), [CONFIG, "num_hidden_layers", "integer"]),
    "eps-string": ("smollm2", edit(CONFIG, rms_norm_eps="tiny"), [CONFIG, "rms_norm_eps", "number"]),
    "theta-list": ("smollm2", edit(CONFIG, rope_theta=[1.0]), [CONFIG, "rope_theta", "number"]),
    "tied-string": ("smollm2", edit(CONFIG, tie_word_embeddings="yes"), [CONFIG, "tie_word_embeddings", "true or false"]),
    "rope-factor-nan": ("smollm2", edit(CONFIG, rope_parameters=None, rope_scaling={"rope_type": "linear", "factor": NAN}), [CONFIG, "rope_scaling", "factor"]),
    "rope-factor-zero": ("smollm2", edit(CONFIG, rope_parameters=None, rope_scaling={"rope_type": "linear", "factor": 0}), [CONFIG, "rope_scaling", "factor"]),
    "rope-llama3-equal-bands": ("smollm2", edit(CONFIG, rope_parameters=None, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0,
        "original_max_position_embeddings": 32}), [CONFIG, "rope_scaling", "high_freq_factor"]),
    "rope-original-context-string": ("smollm2", edit(CONFIG, rope_parameters=None, rope_scaling={"rope_type": "dynamic", "factor": 2.0,
                                                                         "original_max_position_embeddings": "32"}),
                                     [CONFIG, "rope_scaling", "original_max_position_embeddings"]),
    # each size within its range, the whole far past any machine's memory
    "params-past-memory": ("smollm2", edit(CONFIG, hidden_size=2 ** 16, intermediate_size=2 ** 20, num_hidden_layers=1024,
                                           num_attention_heads=128, num_key_value_heads=8), [CONFIG, "memory"]),
    # a vocabulary far larger than the embedding table in the weights (padding it would allocate)
    "vocab-past-weights": ("smollm2", edit(CONFIG, vocab_size=2_000_000), ["model.embed_tokens.weight", "vocab_size"]),
    "config-not-object": ("smollm2", write(CONFIG, "[1, 2, 3]"), [CONFIG, "object"]),
    # tokenizer_config.json / generation_config.json fields of the wrong type or out of range
    "eos-token-int": ("smollm2", edit(TOKCFG, eos_token=5), [TOKCFG, "eos_token"]),
    "bos-token-content-int": ("smollm2", edit(TOKCFG, bos_token={"content": 7}), [TOKCFG, "bos_token"]),
    "template-int": ("smollm2", edit(TOKCFG, chat_template=5), [TOKCFG, "chat_template"]),
    "template-list-of-ints": ("smollm2", edit(TOKCFG, chat_template=[1, 2]), [TOKCFG, "chat_template"]),
    "tokcfg-not-object": ("smollm2", write(TOKCFG, '"just a string"'), [TOKCFG, "object"]),
    "eos-id-string": ("llama2", edit(GENCFG, eos_token_id="2"), [GENCFG, "eos_token_id"]),
    "eos-id-2^100": ("llama2", edit(GENCFG, eos_token_id=2 ** 100), [GENCFG, "eos_token_id"]),
    "eos-id-negative": ("llama2", edit(GENCFG, eos_token_id=-1), [GENCFG, "eos_token_id"]),
    "eos-id-past-vocab": ("llama2", edit(GENCFG, eos_token_id=10 ** 6), [GENCFG, "eos_token_id"]),
    "bos-id-float-list": ("llama2", edit(GENCFG, bos_token_id=[1.5]), [GENCFG, "bos_token_id"]),
    "pad-id-bool": ("llama2", edit(GENCFG, pad_token_id=True), [GENCFG, "pad_token_id"]),
    "gencfg-not-object": ("llama2", write(GENCFG, "[2]"), [GENCFG, "object"]),
    # chat templates: each stopped inside the sandbox, said in one line
    "range-huge": ("smollm2", template("{% for i in range(10**12) %}x{% endfor %}"), [TOKCFG, "chat_template", "range"]),
    "repeat-bomb": ("smollm2", template("{{ 'x' * 50000000 }}"), [TOKCFG, "chat_template", "characters"]),
    "output-bomb": ("smollm2", template("{% for i in range(100000) %}{{ 'abcdefghij' * 100 }}{% endfor %}"),
                    [TOKCFG, "chat_template", "characters"]),
    "concat-doubling": ("smollm2", template("{% set ns = namespace(s='xx') %}{% for i in range(26) %}"
                                            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"),
                        [TOKCFG, "chat_template", "characters"]),
    "plus-doubling": ("smollm2", template("{% set ns = namespace(s='xx') %}{% for i in range(26) %}"
                                         "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}"),
                      [TOKCFG, "chat_template", "characters"]),
    "center-filter": ("smollm2", template("{{ 'x'|center(100000000) }}"), [TOKCFG, "chat_template"]),
    "ljust-method": ("smollm2", template("{{ 'x'.ljust(100000000) }}"), [TOKCFG, "chat_template"]),
    "never-ends": ("smollm2", template("{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}"),
                   [TOKCFG, "chat_template", "steps"]),
    "power-bomb": ("smollm2", template("{{ 7 ** 99999 }}"), [TOKCFG, "chat_template"]),
    "recursion": ("smollm2", template("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"),
                  [TOKCFG, "chat_template", "recursion"]),
    "divide-by-zero": ("smollm2", template("{{ 1 / 0 }}"), [TOKCFG, "chat_template", "division"]),
    "str-plus-int": ("smollm2", template("{{ 'a' + 1 }}"), [TOKCFG, "chat_template"]),
    "syntax-error": ("smollm2", template("{% for %}"), [TOKCFG, "chat_template", "Jinja"]),
    "jinja-not-utf8": ("smollm2", write("chat_template.jinja", b"{{ '\xff\xfe' }}"), ["chat_template.jinja", "UTF-8"]),
    # the shard index: weight_map entries that are not names of files inside the folder
    "map-int": ("llama2", one_entry(5), [INDEX, "weight_map", "model.norm.weight"]),
    "map-parent": ("llama2", one_entry("../model-00001-of-00007.safetensors"), [INDEX, "weight_map", "outside"]),
    "map-absolute": ("llama2", one_entry("/etc/passwd"), [INDEX, "weight_map", "outside"]),
    "map-list": ("llama2", weight_map(lambda m: list(m.values())), [INDEX, "weight_map"]),
    "map-missing": ("llama2", weight_map(lambda m: None), [INDEX, "weight_map"]),
    "index-not-json": ("llama2", write(INDEX, "{"), [INDEX]),
    "shard-missing": ("llama2", replace_shard(lambda p: None), ["model-0000", "missing"]),
    "shard-directory": ("llama2", replace_shard(lambda p: p.mkdir()), ["model-0000", "not a regular file"]),
    "shard-fifo": ("llama2", replace_shard(lambda p: os.mkfifo(p)), ["model-0000", "not a regular file"]),
    "shard-garbage": ("llama2", replace_shard(lambda p: p.write_bytes(b"\xff" * 64)), ["model-0000"]),
    "tokenizer-empty": ("smollm2", write("tokenizer.json", b""), ["tokenizer.json"]),
}


@pytest.mark.parametrize("case", list(IMPORT_CASES))
def test_import_of_a_hostile_model_is_one_line(releases, tmp_path, case):
    name, corrupt, words = IMPORT_CASES[case]
    src = tmp_path / name
    shutil.copytree(releases[name], src)
    corrupt(src)
    r = cli("import", src, "-o", tmp_path / "ck", "--quiet", timeout=TIMEOUT)
    usage_error(r, *words)
    assert not (tmp_path / "ck").exists()


# -- generate: an imported checkpoint whose files were tampered afterwards -------------------------

STEP = "step-000000"
# id: (file in the step directory, corruption, words)
GENERATE_CASES = {
    "layers-string": (edit(CONFIG, n_layers="2"), [CONFIG, "n_layers", "integer"]),
    "rope-base-nan": (edit(CONFIG, rope_base=NAN), [CONFIG, "rope_base", "finite"]),
    "norm-eps-inf": (edit(CONFIG, norm_eps=INF), [CONFIG, "norm_eps", "finite"]),
    "init-std-negative": (edit(CONFIG, init_std=-0.02), [CONFIG, "init_std"]),
    "ffn-overflow": (edit(CONFIG, d_ff=2 ** 62), [CONFIG, "d_ff"]),
    "vocab-overflow": (edit(CONFIG, vocab_size=10 ** 15), [CONFIG, "vocab_size"]),
    "context-huge": (edit(CONFIG, max_seq_len=10 ** 12), [CONFIG, "max_seq_len"]),
    "layers-2^70": (edit(CONFIG, n_layers=2 ** 70), [CONFIG, "n_layers"]),
    "ffn-past-weights": (edit(CONFIG, d_ff=4096), [CONFIG, "mlp"]),
    "tied-null": (edit(CONFIG, tied="no"), [CONFIG, "tied", "true or false"]),
    "rope-scaling-list": (edit(CONFIG, rope_scaling=[1, 2]), [CONFIG, "rope_scaling"]),
    "config-not-object": (write(CONFIG, "[]"), [CONFIG, "object"]),
    "eos-id-2^100": (edit(GENCFG, eos_token_id=2 ** 100), [GENCFG, "eos_token_id"]),
    "pad-id-string": (edit(GENCFG, pad_token_id="0"), [GENCFG, "pad_token_id"]),
    "template-range-huge": (template("{% for i in range(10**12) %}x{% endfor %}"), [TOKCFG, "chat_template", "range"]),
    "template-output-bomb": (template("{% for m in messages %}{% for i in range(100000) %}{{ 'abcdefghij' * 100 }}"
                                      "{% endfor %}{% endfor %}"), [TOKCFG, "chat_template", "characters"]),
    "template-raises": (template("{{ raise_exception('no prompts today') }}"), [TOKCFG, "chat_template", "no prompts today"]),
}


@pytest.mark.parametrize("case", list(GENERATE_CASES))
def test_generate_from_a_tampered_checkpoint_is_one_line(checkpoint, tmp_path, case):
    corrupt, words = GENERATE_CASES[case]
    ck = tmp_path / "ck"
    shutil.copytree(checkpoint, ck)
    corrupt(ck / STEP)
    r = cli("generate", ck, "-p", "The miller", "--max-new-tokens", "2", timeout=TIMEOUT)
    usage_error(r, *words)


def test_the_untampered_release_imports_and_generates(releases, checkpoint, tmp_path):
    """The controls: the same folders, untouched, import and generate (exit 0)."""
    r = cli("import", releases["llama2"], "-o", tmp_path / "llama2", "--quiet", timeout=TIMEOUT)
    assert r.code == 0, r.why()
    for ck in (checkpoint, tmp_path / "llama2"):
        r = cli("generate", ck, "-p", "The miller", "--max-new-tokens", "2", "--json", timeout=TIMEOUT)
        assert r.code == 0 and len(json.loads(r.out)) == 1, r.why()
