"""Hugging Face doors, checked against transformers itself with tiny random-weight models it builds:
import of Llama (plain, llama3 / linear / dynamic RoPE scaling), SmolLM2, Mistral, Qwen2 (q/k/v
biases) and Qwen3 (q/k norm) gives transformers' logits and greedy generations, with the release's
BOS rule, EOS ids (several; generation stops at any) and chat template; export writes the class
that computes the same (Qwen3 for q/k norm, Qwen2 for biases), and export → import is an identity.
What computes differently is refused with one line."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from conftest import llmctl
from test_train import sentences
from llmctl.artifacts.checkpoint import save_checkpoint
from llmctl.model.load import load_checkpoint, load_model
from llmctl.errors import UsageError
from llmctl.model.config import ModelConfig
from llmctl.model.generate import Engine, SamplingParams
from llmctl.model.hf_export import export_hf
from llmctl.model.hf_import import import_hf
from llmctl.model.transformer import Transformer
from llmctl.tokenizer.vocab import Vocab

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

CORPUS = [sentences(random.Random(i), 4) for i in range(200)]
PROMPTS = ["The miller", "A farmer sells", "Our market watches"]
# Chat templates written in the style of the releases (ChatML: Qwen, SmolLM2; header blocks: Llama 3)
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
          " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
CONVERSATION = [{"role": "system", "content": "Name the subject."}, {"role": "user", "content": "The miller carries grain."},
                {"role": "assistant", "content": "the miller"}, {"role": "user", "content": "A farmer builds a red boat."}]


def byte_level(specials: list[str], bos: str | None = None) -> Tokenizer:
    """A GPT-2-style byte-level BPE (Llama 3, Qwen, SmolLM2); with `bos`, a post-processor adds it."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos:
        tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])])
    return tok


def metaspace() -> Tokenizer:
    """A sentencepiece-style BPE (Llama 2, Mistral): ▁ for spaces, <s> added in front of every text."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, rms_norm_eps=1e-6)
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# name: (config class, config keys, tokenizer maker, tokenizer_config.json, generation_config.json or None,
#        imported as chat?, save options)
ARCHS = {
    "llama2": ("LlamaConfig", dict(rope_theta=5000.0), metaspace,
               {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
               {"bos_token_id": 1, "eos_token_id": 2}, False, {"max_shard_size": "60KB"}),
    "llama3.2": ("LlamaConfig", dict(tie_word_embeddings=True, rope_theta=500000.0, rope_scaling={
                     "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 32}),
                 lambda: byte_level(LLAMA3_SPECIALS, bos="<|begin_of_text|>"),
                 {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                  "chat_template": LLAMA3},
                 {"bos_token_id": 0, "eos_token_id": [1, 4]}, True, {"dtype": torch.bfloat16}),
    "llama-linear": ("LlamaConfig", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}), metaspace,
                     {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                     None, False, {}),
    "llama-dynamic": ("LlamaConfig", dict(max_position_embeddings=32, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
                      metaspace, {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                      None, False, {}),
    "smollm2": ("LlamaConfig", dict(tie_word_embeddings=True), lambda: byte_level(CHATML_SPECIALS),
                {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                 "pad_token": "<|im_end|>", "chat_template": CHATML}, None, True, {}),
    "mistral": ("MistralConfig", dict(sliding_window=None), metaspace,
                {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                {"bos_token_id": 1, "eos_token_id": 2}, False, {}),
    "qwen2.5": ("Qwen2Config", dict(tie_word_embeddings=True), lambda: byte_level(CHATML_SPECIALS),
                {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                 "chat_template": CHATML}, {"bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 0}, True, {}),
    "qwen3-base": ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=False), lambda: byte_level(CHATML_SPECIALS),
                   {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|endoftext|>",
                    "pad_token": "<|endoftext|>", "chat_template": CHATML}, {"bos_token_id": 0, "eos_token_id": 0}, False, {}),
}


def build(name: str, root, seed: int = 0):
    """A release-shaped directory of architecture `name` with random weights (norm gains and
    biases moved off their init, so a swapped or dropped one shows in the logits)."""
    cls, keys, make_tok, tok_cfg, gen, _, save = ARCHS[name]
    src = root / name
    tok = make_tok()
    cfg = getattr(transformers, cls)(vocab_size=tok.get_vocab_size() + 48, **{**SMALL, **keys})  # padded like a release
    if gen:
        cfg.eos_token_id, cfg.bos_token_id = gen["eos_token_id"], gen.get("bos_token_id")
    else:  # the EOS only in config.json and tokenizer_config.json
        cfg.eos_token_id = tok.token_to_id(tok_cfg["eos_token"])
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model = model.to(save.get("dtype", torch.float32))
    model.save_pretrained(src, **{k: v for k, v in save.items() if k != "dtype"})
    (src / "generation_config.json").unlink(missing_ok=True)
    if gen:
        (src / "generation_config.json").write_text(json.dumps(gen))
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return src


def hf_model(src):
    return transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    root = tmp_path_factory.mktemp("releases")
    return {name: build(name, root) for name in ARCHS}


@pytest.mark.parametrize("name", list(ARCHS))
def test_import_matches_transformers_logits_and_greedy_generation(releases, name, tmp_path):
    src = releases[name]
    ck = tmp_path / "ck"
    import_hf(src, ck)
    ours, c = load_model(ck)
    hf = hf_model(src)
    cfg = c.config
    assert (cfg.qkv_bias, cfg.o_bias, cfg.qk_norm) == (name == "qwen2.5", False, name == "qwen3-base")
    assert (cfg.rope_scaling or {}).get("rope_type") == (ARCHS[name][1].get("rope_scaling") or {}).get("rope_type")
    assert c.trainer_state["chat"] is ARCHS[name][5]
    if name == "llama3.2":  # a bf16 release stays bf16: no fp32 copy of the whole model on import
        assert c.tensors["embed.weight"].dtype == torch.bfloat16
    torch.manual_seed(1)
    T = 48 if name == "llama-dynamic" else 40  # dynamic NTK past its 32-token context
    ids = torch.randint(0, hf.config.vocab_size, (2, T))
    with torch.no_grad():
        diff = (ours(ids)[..., : hf.config.vocab_size] - hf(ids).logits).abs().max().item()
    assert diff <= 1e-4, diff

    vocab = Vocab(c.path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(src)
    engine = Engine.for_vocab(ours, vocab, chat=False)
    for prompt in PROMPTS:
        ids = vocab.prompt_ids(prompt)
        assert ids == hf_tok(prompt)["input_ids"]  # BOS exactly when the release's tokenizer adds it
        g = engine.generate([ids], SamplingParams(max_new_tokens=12))[0]
        theirs = hf_greedy(hf, ids, 12)
        assert g.ids + ([g.stop_id] if g.finish == "eos" else []) == theirs, (prompt, g.ids, theirs)


@pytest.mark.parametrize("name", ["llama2", "qwen2.5", "llama3.2"])
def test_generation_stops_at_any_of_several_eos_ids(releases, name, tmp_path):
    """A token greedy decoding reaches after a few steps is made an extra EOS id: both engines stop there."""
    src = tmp_path / "src"
    shutil.copytree(releases[name], src)
    hf = hf_model(src)
    vocab = Vocab(src)
    hf.generation_config.eos_token_id = None
    for text in PROMPTS:  # a prompt whose free greedy continuation brings a new token after the first
        prompt = vocab.prompt_ids(text)
        free = hf_greedy(hf, prompt, 12)
        k = next((i for i, t in enumerate(free) if i >= 1 and t not in free[:i] and t not in vocab.eos_ids), None)
        if k is not None:
            break
    assert k is not None
    gen = json.loads((src / "generation_config.json").read_text()) if (src / "generation_config.json").is_file() else {}
    gen["eos_token_id"] = [*vocab.eos_ids, free[k]]
    (src / "generation_config.json").write_text(json.dumps(gen))
    import_hf(src, tmp_path / "ck")
    ours, _ = load_model(tmp_path / "ck")
    g = Engine.for_vocab(ours, Vocab(load_checkpoint(tmp_path / "ck").path), chat=False).generate([prompt], SamplingParams(max_new_tokens=12))[0]
    assert (g.ids, g.finish, g.stop_id) == (free[:k], "eos", free[k])
    assert hf_greedy(hf_model(src), prompt, 12) == free[: k + 1]


@pytest.mark.parametrize("name", ["llama3.2", "qwen2.5", "smollm2"])
def test_chat_template_gives_apply_chat_template_ids_and_a_turn_mask(releases, name):
    vocab = Vocab(releases[name])
    hf_tok = transformers.AutoTokenizer.from_pretrained(releases[name])
    expected = hf_tok.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert vocab.chat.prompt_ids(CONVERSATION) == list(expected)
    end = {"llama3.2": "<|eot_id|>"}.get(name, "<|im_end|>")
    assert vocab.chat.end_ids == (vocab.tok.token_to_id(end),)
    ids, mask = vocab.chat.encode_chat(CONVERSATION[:3])
    trained = vocab.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "the miller" + end  # the answer and the turn end, nothing of the prompt
    assert vocab.stop_ids(chat=True)[0] == vocab.tok.token_to_id(end)


def test_imported_chat_model_generates_through_its_template(releases, tmp_path):
    """`llmctl generate` on an instruct import prompts through its template, as HF does."""
    src = releases["qwen2.5"]
    llmctl("import", src, "-o", tmp_path / "ck", check=True)
    p = llmctl("generate", tmp_path / "ck", "-p", "The miller carries grain.", "--max-new-tokens", "6", "--json", check=True)
    out = json.loads(p.stdout)[0]
    hf_tok = transformers.AutoTokenizer.from_pretrained(src)
    prompt = hf_tok.apply_chat_template([{"role": "user", "content": "The miller carries grain."}],
                                        add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    theirs = hf_greedy(hf_model(src), list(prompt), 6)
    assert out["tokens"] == len([t for t in theirs if t not in (0, 2)])
    import_hf(src, tmp_path / "base", chat=False)
    assert load_checkpoint(tmp_path / "base").trainer_state["chat"] is False
    assert import_hf(src, tmp_path / "ck") == tmp_path / "ck" / "step-000000"  # the same import again: nothing to do
    assert load_checkpoint(tmp_path / "ck").trainer_state["chat"] is True
    with pytest.raises(UsageError, match="another config.*--overwrite"):  # another import into it
        import_hf(src, tmp_path / "ck", chat=False)


def _refusal(src, **changes):
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, **changes}))


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"]}, "OLMo 2 normalizes after each sublayer"),
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "GPT-2 has learned positions"),
    ({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}, "model_type 'phi3'"),
    ({"sliding_window": 16}, "sliding window of 16 tokens"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "rope_parameters": None}, "'yarn' is not supported"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_import_refuses_what_computes_differently(releases, tmp_path, changes, message):
    src = tmp_path / "src"
    shutil.copytree(releases["mistral"], src)
    _refusal(src, **changes)
    with pytest.raises(UsageError, match=message):
        import_hf(src, tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


def test_import_errors_are_one_line(releases, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(releases["llama2"], src)
    _refusal(src, model_type="olmo2", architectures=["Olmo2ForCausalLM"])
    p = llmctl("import", src, "-o", tmp_path / "a")
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and "OLMo 2" in err and len(err.splitlines()) == 1
    _refusal(src, model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=3)
    p = llmctl("import", src, "-o", tmp_path / "b")
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and "model.layers.2." in err and len(err.splitlines()) == 1


# -- export ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, cls", [({"qk_norm": True}, "Qwen3ForCausalLM"), ({"qkv_bias": True}, "Qwen2ForCausalLM"),
                                     ({"qkv_bias": True, "o_bias": True}, "LlamaForCausalLM"),
                                     ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "LlamaForCausalLM")])
def test_export_writes_the_class_that_computes_the_same_and_import_inverts_it(releases, tmp_path, kw, cls):
    tok = releases["qwen2.5"] / "tokenizer.json"
    cfg = ModelConfig(vocab_size=Vocab(tok).size, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=96,
                      tied=False, **kw)
    torch.manual_seed(0)
    ours = Transformer(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_checkpoint(tmp_path / "ck", 3, cfg, ours.state_dict(), {"step": 3}, tokenizer_file=tok)
    export_hf(tmp_path / "ck", tmp_path / "hf")
    hf = hf_model(tmp_path / "hf")
    assert type(hf).__name__ == cls and hf.config.vocab_size == cfg.vocab_size
    ids = torch.randint(0, cfg.vocab_size, (2, 40))
    with torch.no_grad():
        assert (ours(ids)[..., : cfg.vocab_size] - hf(ids).logits).abs().max().item() <= 1e-4
    import_hf(tmp_path / "hf", tmp_path / "back")
    back, ck = load_model(tmp_path / "back")
    assert ck.config == cfg
    with torch.no_grad():  # the padding rows (never produced, never sampled) come back as zeros
        assert (ours(ids) - back(ids))[..., : cfg.vocab_size].abs().max().item() < 1e-5


def check_chat_export(run, out):
    """Export of a chat (SFT/RL) checkpoint: transformers renders, stops and answers as llmctl does.
    Called by test_sft with the SFT model it trains."""
    from llmctl.tokenizer.chat import ChatTemplate

    llmctl("export", run, "-o", out, check=True)
    ck = load_checkpoint(run)
    template = ChatTemplate(ck.tokenizer_file)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = hf_model(out)
    assert model.config.vocab_size == len(tok) == ck.config.vocab_size  # no padding id can be sampled
    end, eot = template.end_id, tok.convert_tokens_to_ids("<|endoftext|>")
    assert model.generation_config.eos_token_id == [end, eot] and tok.eos_token == "<|end|>"
    assert tok.pad_token == "<|pad|>" and tok.bos_token == "<|endoftext|>"
    turns = [{"role": "user", "content": "The miller carries grain."}, {"role": "assistant", "content": "the miller"},
             {"role": "user", "content": "A farmer builds a red boat."}]
    assert tok.apply_chat_template(turns, tokenize=True, return_dict=True)["input_ids"] == template.encode_chat(turns)[0]
    questions = ["The miller carries grain to town.", "My sister sells the stone wall.", "The river watches twelve baskets."]
    p = llmctl("generate", run, *[a for q in questions for a in ("-p", q)], "--max-new-tokens", "24", "--json", check=True)
    stopped = 0
    for question, ours in zip(questions, json.loads(p.stdout)):
        msgs = [{"role": "user", "content": question}]
        prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        assert prompt == template.prompt_ids(msgs)
        theirs = hf_greedy(model, prompt, 24)
        if ours["finish"] == "eos":
            stopped += 1
            assert theirs[-1] == end and len(theirs) == ours["tokens"] + 1
        assert tok.decode(theirs, skip_special_tokens=True) == ours["completion"]
    assert stopped >= 2  # the SFT model ends its answers with <|end|>, and transformers stops there
    torch.manual_seed(0)
    sampled = model.generate(torch.tensor([prompt]), do_sample=True, temperature=1.0, max_new_tokens=64,
                             num_return_sequences=8, eos_token_id=None)
    assert int(sampled.max()) < len(tok)
    llmctl("import", out, "-o", out.parent / "back", check=True)
    back = load_checkpoint(out.parent / "back")
    assert back.config == ck.config and back.trainer_state["chat"] is True  # export -> import keeps the chat flag
    rows = ck.config.vocab_size  # every trained weight comes back; the padding rows past the tokenizer as zeros
    assert all(torch.equal(back.tensors[k][:rows], v[:rows]) for k, v in ck.tensors.items())


def test_bring_your_own_model_import_sft_rl_export(releases, tmp_path):
    """README's "Bring your own model" path on a Qwen2.5-shaped instruct release: import, SFT in its
    own ChatML template (loss on the answers and <|im_end|>), RL, export, chat in transformers."""
    src = releases["qwen2.5"]
    llmctl("import", src, "-o", tmp_path / "ck", check=True)
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"question": f"What is {a} plus {a % 7}?", "answer": f"#### {a + a % 7}"}) + "\n"
                             for a in range(1, 60)))
    llmctl("train", "--sft", chats, "--init", tmp_path / "ck", "-o", tmp_path / "sft", "--seq-len", "64", "--batch-tokens",
           "512", "--micro-batch", "8", "--max-steps", "4", "--lr", "1e-3", "--threads", "1", check=True)
    sft = load_checkpoint(tmp_path / "sft")
    assert sft.trainer_state["chat"] is True and sft.trainer_state["chat_template"] == Vocab(src).chat.name
    assert (sft.path / "tokenizer_config.json").is_file() and (sft.path / "generation_config.json").is_file()
    llmctl("rl", tmp_path / "sft", "--prompts", chats, "-o", tmp_path / "rl", "--steps", "1", "--prompts-per-step", "2",
           "-G", "2", "--max-new-tokens", "8", "--headroom-limit", "0", check=True)
    llmctl("export", tmp_path / "rl", "-o", tmp_path / "hf", check=True)
    hf = hf_model(tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert type(hf).__name__ == "Qwen2ForCausalLM" and tok.eos_token == "<|im_end|>"
    assert hf.generation_config.eos_token_id == [2, 0]  # the turn end first, then the release's other EOS
    msgs = [{"role": "user", "content": "What is 3 plus 3?"}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    theirs = hf_greedy(hf, list(prompt), 8)
    p = llmctl("generate", tmp_path / "rl", "-p", msgs[0]["content"], "--max-new-tokens", "8", "--json", check=True)
    assert json.loads(p.stdout)[0]["completion"] == tok.decode([t for t in theirs if t not in (0, 2)])
