"""llmctl dpo: the preference losses on hand-worked numbers (value and gradient sign), the cached
reference log-probs equal to live ones, a tiny run that learns its pairs, bad pair files (counted
skips, one-line errors naming file:line), and resume that is bitwise an uninterrupted run."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import llmctl
from preflib import final_weights, make_checkpoint, metrics, pair_records, train_config, write_jsonl
from llmctl.errors import UsageError
from llmctl.torchrt.distributed import Dist
from llmctl.train.dpo import REF_FILE, DPOSettings, preference_loss, reference_logps, run_dpo, sequence_logps
from llmctl.train.pairs import read_pairs


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("dpo")
    ck, tok = make_checkpoint(d)
    write_jsonl(d / "pairs.jsonl", pair_records(48))
    return d, ck, tok


def _grad(s, values):
    t = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values]
    loss, r_c, r_r = preference_loss(s, *t)
    loss.backward()
    return float(loss.detach()), [float(x.grad) if x.grad is not None else 0.0 for x in t], float(r_c.detach()), float(r_r.detach())


# -- the losses, by hand ------------------------------------------------------------------------

def test_sigmoid_loss_by_hand():
    # β 0.1; policy chosen −10, rejected −12; reference −11 for both: h = (−10+11) − (−12+11) = 2
    loss, g, r_c, r_r = _grad(DPOSettings("sigmoid", 0.1).resolved(), [-10.0, -12.0, -11.0, -11.0])
    assert loss == pytest.approx(math.log(1 + math.exp(-0.2)), abs=1e-12)  # −log σ(0.2) = 0.5981388...
    assert loss == pytest.approx(0.5981388693, abs=1e-9)
    assert (r_c, r_r) == pytest.approx((0.1, -0.1))  # β·(log π − log π_ref): the margin is 0.2
    s = 1 / (1 + math.exp(0.2))  # σ(−βh)
    assert g[0] == pytest.approx(-0.1 * s) and g[0] < 0  # more chosen probability lowers the loss
    assert g[1] == pytest.approx(0.1 * s) and g[1] > 0  # more rejected probability raises it


def test_ipo_loss_by_hand():
    # IPO: (h − 1/(2τ))², τ = β = 0.1 → target margin 5; h = 2 on these (length-averaged) log-probs
    loss, g, _, _ = _grad(DPOSettings("ipo", 0.1).resolved(), [-1.0, -3.0, -2.0, -2.0])
    assert loss == pytest.approx(9.0)
    assert g[0] == pytest.approx(-6.0) and g[1] == pytest.approx(6.0)  # 2(h − 5) = −6: push the margin up
    loss, g, _, _ = _grad(DPOSettings("ipo", 0.1).resolved(), [5.0, -3.0, -2.0, -2.0])  # h = 8 > 5: pulled back
    assert loss == pytest.approx(9.0) and g[0] == pytest.approx(6.0)


def test_simpo_loss_by_hand():
    # SimPO: −log σ(β(ℓ_c − ℓ_r) − γ), β 2, γ 1 (0.5·β, the default), ℓ averaged log-probs; no reference
    s = DPOSettings("simpo").resolved()
    assert (s.beta, s.gamma) == (2.0, 1.0)
    loss, g, r_c, r_r = _grad(s, [-1.0, -1.5])
    assert loss == pytest.approx(math.log(2))  # 2·0.5 − 1 = 0
    assert g[0] == pytest.approx(-1.0) and g[1] == pytest.approx(1.0)  # β·σ(0) = 1
    assert (r_c, r_r) == pytest.approx((-2.0, -3.0))


def test_settings_are_checked():
    with pytest.raises(UsageError, match="--loss"):
        DPOSettings("hinge").resolved()
    with pytest.raises(UsageError, match="--gamma"):
        DPOSettings("sigmoid", gamma=1.0).resolved()
    with pytest.raises(UsageError, match="--beta"):
        DPOSettings("sigmoid", beta=0.0).resolved()
    assert DPOSettings().resolved().resolved() == DPOSettings().resolved()


def test_sequence_logps_sum_only_the_targets():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    y = torch.tensor([[-100, 3, 4, -100, -100], [1, 2, -100, 7, 0]])
    sums, counts = sequence_logps(logits, y)
    lp = F.log_softmax(logits, -1)
    want = [lp[0, 1, 3] + lp[0, 2, 4], lp[1, 0, 1] + lp[1, 1, 2] + lp[1, 3, 7] + lp[1, 4, 0]]
    assert torch.allclose(sums, torch.stack(want)) and counts.tolist() == [2, 4]


# -- runs ---------------------------------------------------------------------------------------

def test_cached_reference_equals_live_and_is_reused(base, tmp_path):
    d, ck, tok = base
    logs = []
    run_dpo(d / "pairs.jsonl", ck, tmp_path / "run", train_config(max_steps=2), DPOSettings(), on_log=logs.append)
    doc = json.loads((tmp_path / "run" / REF_FILE).read_text())
    from llmctl.tokenizer.vocab import Vocab

    template = Vocab(tok).require_chat()
    pairs = read_pairs(d / "pairs.jsonl", template, 64).pairs
    live = reference_logps(ck, "auto", pairs, template.pad_id, Dist(), "float32", micro=5)  # other batch shapes
    assert torch.allclose(torch.tensor(doc["logps"], dtype=torch.float64), live, atol=1e-4, rtol=0)
    assert any("computed" in m for m in logs)
    # at step 1 the policy is the reference: every reward is 0 and the loss is log 2
    first = metrics(tmp_path / "run")[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5) and abs(first["reward_margin"]) < 1e-4
    logs.clear()
    run_dpo(d / "pairs.jsonl", ck, tmp_path / "run", train_config(max_steps=4), DPOSettings(), resume=True,
            on_log=logs.append)
    assert any(f"from {tmp_path / 'run' / REF_FILE}" in m for m in logs)  # read, not recomputed


def test_tiny_dpo_learns_its_pairs(base, tmp_path):
    d, ck, _ = base
    m = run_dpo(d / "pairs.jsonl", ck, tmp_path / "run", train_config(lr=3e-3, eval_every=0),
                DPOSettings("sigmoid", 0.5), epochs=10, val_fraction=0.0)
    recs = metrics(tmp_path / "run")
    early = sum(r["pref_accuracy"] for r in recs[1:7]) / 6  # the first epoch after step 1 (step 1's rewards are all 0)
    late = sum(r["pref_accuracy"] for r in recs[-6:]) / 6
    assert late > early + 0.2 and late >= 0.85, (early, late)
    assert recs[-1]["reward_margin"] > 0 and recs[-1]["implicit_kl"] != 0
    assert m.stage == "dpo" and m.counts["pairs"] == 48


@pytest.mark.parametrize("loss", ["ipo", "simpo"])
def test_other_losses_run(base, tmp_path, loss):
    d, ck, _ = base
    run_dpo(d / "pairs.jsonl", ck, tmp_path / "run", train_config(max_steps=2), DPOSettings(loss))
    rec = metrics(tmp_path / "run")[-1]
    assert math.isfinite(rec["loss"]) and "pref_accuracy" in rec
    assert (tmp_path / "run" / REF_FILE).exists() == (loss == "ipo")  # simpo has no reference
    assert ("implicit_kl" in rec) == (loss == "ipo")


def test_resume_is_bitwise(base, tmp_path):
    d, ck, _ = base
    cfg = dict(checkpoint_every=3, eval_every=0)
    run_dpo(d / "pairs.jsonl", ck, tmp_path / "a", train_config(max_steps=8, **cfg), DPOSettings(), val_fraction=0.1)
    run_dpo(d / "pairs.jsonl", ck, tmp_path / "b", train_config(max_steps=3, **cfg), DPOSettings(), val_fraction=0.1)
    run_dpo(d / "pairs.jsonl", ck, tmp_path / "b", train_config(max_steps=8, **cfg), DPOSettings(), val_fraction=0.1,
            resume=True)
    keys = ("loss", "reward_margin", "chosen_logps", "grad_norm")
    assert [[r[k] for k in keys] for r in metrics(tmp_path / "a")] == [[r[k] for k in keys] for r in metrics(tmp_path / "b")]
    wa, wb = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# -- bad pair files -----------------------------------------------------------------------------

def test_bad_pairs_are_counted_skips_named_by_line(base, tmp_path):
    d, ck, _ = base
    good = pair_records(12)
    bad = [{"prompt": "Name the subject. The river sells grain.", "rejected": "the river"},  # line 13: no chosen
           {"prompt": "Name the subject.", "chosen": "  ", "rejected": "a farmer"},  # 14: empty
           {"prompt": "Name the subject.", "chosen": "a farmer", "rejected": "a farmer"},  # 15: identical
           {"prompt": "Talk. " * 40, "chosen": "yes", "rejected": "no"},  # 16: too long for seq_len 64
           {"prompt": "Hi", "chosen": [{"role": "user", "content": "x"}], "rejected": "no"},  # 17: not assistant turns
           {"prompt": "Hi", "chosen": 3, "rejected": "no"}]  # 18: not a string or messages
    write_jsonl(tmp_path / "pairs.jsonl", good + bad)
    logs = []
    m = run_dpo(tmp_path / "pairs.jsonl", ck, tmp_path / "run", train_config(max_steps=1), DPOSettings(), on_log=logs.append)
    assert {k: v for k, v in m.counts.items() if k.startswith("skipped_") and k != "skipped_steps"} == {
        "skipped_missing_field": 1, "skipped_empty_completion": 1, "skipped_identical": 1, "skipped_too_long": 1,
        "skipped_bad_messages": 2}
    assert m.counts["pairs"] == 12 and m.counts["records"] == 18
    warning = next(x for x in logs if x.startswith("warning: skipped 6"))
    for line in (13, 14, 15, 16, 17):
        assert f"pairs.jsonl:{line}:" in warning


def test_no_usable_pair_and_broken_json_are_one_line_errors(base, tmp_path):
    d, ck, _ = base
    write_jsonl(tmp_path / "none.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "b"}])
    with pytest.raises(UsageError, match=r"none.jsonl:1: chosen and rejected are the same"):
        run_dpo(tmp_path / "none.jsonl", ck, tmp_path / "run", train_config(), DPOSettings())
    (tmp_path / "broken.jsonl").write_text(json.dumps(pair_records(1)[0]) + "\n{not json\n")
    p = llmctl("dpo", ck, "--pairs", tmp_path / "broken.jsonl", "-o", tmp_path / "cli", "--threads", "1")
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "broken.jsonl:2: not valid JSON" in err


def test_cli_dpo_runs_and_reports(base, tmp_path):
    d, ck, _ = base
    p = llmctl("dpo", ck, "--pairs", d / "pairs.jsonl", "-o", tmp_path / "run", "--seq-len", "64", "--batch-pairs", "8",
               "--micro-batch", "8", "--max-steps", "2", "--threads", "1", "--loss", "ipo", "--json", "-q", check=True)
    out = json.loads(p.stdout)
    assert out["stage"] == "dpo" and out["counts"]["steps"] == 2
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["dpo"]["loss"] == "ipo" and cfg["dpo"]["beta"] == 0.1
    ck_state = json.loads(next((tmp_path / "run" / "checkpoints").glob("step-*/trainer_state.json")).read_text())
    assert ck_state["chat"] is True


def test_two_ranks_match_one_process(base, tmp_path):
    """torchrun with 2 gloo ranks: each computes half the reference table and half of every batch;
    the metrics (all-reduced) and the held-out numbers are the single process's to float rounding."""
    import os
    import subprocess
    import sys

    d, ck, _ = base
    args = ["dpo", ck, "--pairs", d / "pairs.jsonl", "--seq-len", "64", "--batch-pairs", "8", "--micro-batch", "2",
            "--max-steps", "3", "--val-fraction", "0.2", "--eval-every", "3", "-q", "--device", "cpu"]
    llmctl(*args, "-o", tmp_path / "one", check=True)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "llmctl",
                        *map(str, args), "-o", str(tmp_path / "two")], capture_output=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    a = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert len(a) == len(b) == 4 and "val" in a[-1]
    for ra, rb in zip(a, b):
        for k in ("loss", "reward_margin", "pref_accuracy", "chosen_logps", "rejected_logps", "implicit_kl"):
            if k in ra:
                assert rb[k] == pytest.approx(ra[k], rel=1e-5, abs=1e-5), k
        if "val" in ra:
            assert rb["val"] == pytest.approx(ra["val"], rel=1e-5, abs=1e-5)
    ref = [torch.tensor(json.loads((tmp_path / run / REF_FILE).read_text())["logps"]) for run in ("one", "two")]
    assert torch.allclose(ref[0], ref[1], atol=1e-4, rtol=0)


def test_an_imported_chatml_model_trains_through_its_own_template(tmp_path):
    """A Qwen2.5-shaped release imported: pairs render through its ChatML template (the ids
    transformers' apply_chat_template gives), the loss mask is the completion and its <|im_end|>."""
    import transformers

    from test_hf_models import build
    from llmctl.tokenizer.vocab import Vocab
    from llmctl.train.pairs import encode_side

    src = build("qwen2.5", tmp_path)
    llmctl("import", src, "-o", tmp_path / "ck", check=True)
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The miller carries grain. Who?"}]
    chosen = [{"role": "assistant", "content": "The miller."}]
    ids, mask = encode_side(Vocab(tmp_path / "ck" / "step-000000").require_chat(), prompt, chosen)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    full = tok.apply_chat_template(prompt + chosen, tokenize=True, return_dict=True)["input_ids"]
    head = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert ids == list(full) and full[:len(head)] == head
    end = tok.convert_tokens_to_ids("<|im_end|>")
    last = len(head) + list(full[len(head):]).index(end)
    assert mask == [0] * len(head) + [1] * (last + 1 - len(head)) + [0] * (len(full) - last - 1)
    write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": prompt, "chosen": chosen,
                                            "rejected": [{"role": "assistant", "content": "A farmer."}]}] * 4)
    m = run_dpo(tmp_path / "pairs.jsonl", tmp_path / "ck", tmp_path / "run", train_config(batch_tokens=64 * 4),
                DPOSettings(), epochs=2)
    assert m.counts["steps"] == 2 and m.counts["pairs"] == 4


def test_sigterm_then_resume_is_the_uninterrupted_run(base, tmp_path):
    """Killed with SIGTERM mid-run (checkpoint at the end of the step), resumed with --resume: the
    same per-step losses and margins as the run that was never stopped, bit for bit."""
    import signal
    import subprocess
    import sys
    import time

    d, ck, _ = base
    args = ["dpo", ck, "--pairs", d / "pairs.jsonl", "--seq-len", "64", "--batch-pairs", "8", "--micro-batch", "4",
            "--epochs", "20", "--lr", "1e-3", "--checkpoint-every", "1000", "--threads", "1", "--device", "cpu"]
    llmctl(*args, "-o", tmp_path / "full", "-q", check=True)
    cut = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "llmctl", *map(str, args), "-o", str(cut), "-q"], stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        m = cut / "metrics.jsonl"
        if m.is_file() and sum(1 for line in m.read_text().splitlines() if '"loss"' in line) >= 6:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    stopped = json.loads(next(cut.glob("checkpoints/step-*/trainer_state.json")).read_text())["step"]
    assert 6 <= stopped < 120
    p = llmctl(*args, "-o", cut, "--resume", check=True)
    assert f"from {cut / REF_FILE}" in p.stderr.decode()  # the cached reference, not recomputed
    keys = ("loss", "reward_margin", "pref_accuracy", "chosen_logps", "rejected_logps", "grad_norm")
    assert [[r[k] for k in keys] for r in metrics(cut)] == [[r[k] for k in keys] for r in metrics(tmp_path / "full")]
