"""Decoding: KV cache == no cache, sampling filters, EOS, beam search on a toy model whose
best sequence is known by brute force."""

import itertools
import time
from dataclasses import dataclass

import pytest
import torch

from steps.models.generate import beam_search, filter_logits, generate, visible
from steps.models.gpt import GPTConfig, GPTLMHeadModel

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=["learned", "rope"])
def model(request):
    torch.manual_seed(0)
    return GPTLMHeadModel(
        GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=16, pos=request.param)
    ).eval()


def test_kv_cache_equals_no_cache(model):
    prompt = torch.randint(0, 40, (3, 5), generator=torch.Generator().manual_seed(0))
    a = generate(model, prompt, 12, use_cache=True)
    b = generate(model, prompt, 12, use_cache=False)
    assert a.shape == (3, 17) and torch.equal(a, b)
    for kw in ({"temperature": 0.7, "top_k": 10}, {"temperature": 1.3, "top_p": 0.8}):
        s1 = generate(
            model, prompt, 12, do_sample=True, use_cache=True, generator=torch.Generator().manual_seed(5), **kw
        )
        s2 = generate(
            model, prompt, 12, do_sample=True, use_cache=False, generator=torch.Generator().manual_seed(5), **kw
        )
        assert torch.equal(s1, s2)
    assert torch.equal(
        beam_search(model, prompt[:1], 3, 8, use_cache=True)[0],
        beam_search(model, prompt[:1], 3, 8, use_cache=False)[0],
    )


def test_generation_past_block_size_crops_context(model):
    out = generate(model, torch.zeros(1, 30, dtype=torch.long), 6)
    assert out.shape == (1, 36)


def test_filter_logits():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2))[0].tolist() == [False, False, True, True]
    # nucleus: 0.5 < 0.7, 0.5 + 0.3 >= 0.7 -> keep two
    assert torch.isinf(filter_logits(logits, top_p=0.7))[0].tolist() == [False, False, True, True]
    assert torch.isinf(filter_logits(logits, top_p=0.45))[0].tolist() == [False, True, True, True]
    sharp = filter_logits(logits, temperature=0.01).softmax(-1)
    assert sharp[0, 0] > 0.999


def test_low_temperature_sampling_is_greedy(model):
    prompt = torch.randint(0, 40, (2, 3), generator=torch.Generator().manual_seed(1))
    s = generate(model, prompt, 8, do_sample=True, temperature=1e-6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(s, generate(model, prompt, 8))


@dataclass
class Out:
    logits: torch.Tensor
    past_key_values: tuple | None = None


class Bigram(torch.nn.Module):
    """Next-token log-probs depend on the last token only: a table we can search exhaustively."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.log(torch.tensor(table, dtype=torch.float64))

    def forward(self, input_ids, past_key_values=None, use_cache=False):
        return Out(self.table[input_ids], past_key_values=() if use_cache else None)


# token 0 = start, 3 = EOS. Greedy takes 1 (0.6) then is stuck with 0.34-ish; 2 (0.4) leads to a
# near-certain path, so the best 3-token sequence starts with 2.
TABLE = [[0.01, 0.59, 0.39, 0.01], [0.01, 0.34, 0.33, 0.32], [0.005, 0.005, 0.98, 0.01], [0.25, 0.25, 0.25, 0.25]]


def brute_force(n):
    table = torch.log(torch.tensor(TABLE, dtype=torch.float64))
    best = max(itertools.product(range(4), repeat=n), key=lambda s: sum(table[a, b] for a, b in zip((0,) + s, s)))
    return list(best)


def test_beam_search_finds_known_best():
    toy = Bigram(TABLE)
    start = torch.zeros(1, 1, dtype=torch.long)
    greedy = generate(toy, start, 3, use_cache=False)[0, 1:].tolist()
    beam, score = beam_search(toy, start, num_beams=2, max_new_tokens=3, use_cache=False)
    assert greedy == [1, 1, 1]
    assert beam[0, 1:].tolist() == brute_force(3) == [2, 2, 2]
    assert score == pytest.approx(float(sum(torch.log(torch.tensor([0.39, 0.98, 0.98])))) / 3)


def test_beam_search_eos_and_length_penalty():
    # from 0: EOS at once (p=0.4) or a long path 1->1->... (0.6 * 0.9^k); EOS after 1 is 0.1
    table = [[0.0001, 0.5999, 0.0, 0.4], [0.0001, 0.8999, 0.0, 0.1], [0.25] * 4, [0.25] * 4]
    table = [[max(p, 1e-9) for p in row] for row in table]
    toy = Bigram(table)
    start = torch.zeros(1, 1, dtype=torch.long)
    short, _ = beam_search(toy, start, 3, 6, length_penalty=0.0, eos_token_id=3, use_cache=False)
    assert short[0, 1:].tolist() == [3]  # raw log-prob: stopping now (0.4) beats everything else
    long_, _ = beam_search(toy, start, 3, 6, length_penalty=2.0, eos_token_id=3, use_cache=False)
    assert len(long_[0]) > 3  # a strong length bonus prefers a longer hypothesis


def test_greedy_stops_on_eos():
    table = [[0.1, 0.1, 0.1, 0.7], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1], [0.25] * 4]
    toy = Bigram(table)
    out = generate(toy, torch.tensor([[0], [2]]), 5, eos_token_id=3, use_cache=False)
    assert out[0].tolist() == [0, 3, 3, 3, 3, 3]  # finished rows keep emitting EOS (HF padding)
    assert out[1].tolist() == [2, 2, 2, 2, 2, 2]
    out = generate(toy, torch.tensor([[0]]), 5, eos_token_id=3, use_cache=False)
    assert out.tolist() == [[0, 3]]  # all done: stop early


@pytest.mark.parametrize(
    "text, shown",
    [
        ("", "∅"),
        ("\n\n", "⏎\n⏎\n"),
        ("  \n ", "··⏎\n·"),
        ("the king is dead", "the king is dead"),
        ("the king\n\nwas  here ", "the king⏎\n⏎\nwas··here·"),
        ("a\tb", "a→b"),
    ],
)
def test_whitespace_a_terminal_hides_is_shown(text, shown):
    """A small model's whitespace-only output would print as blank lines (chat, samples.md)."""
    assert visible(text) == shown


def test_cli_help_shows_defaults(capsys):
    from steps.chat import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 60)" in out and "(default: results/gpt_train/main/ckpt.pt)" in out
    assert "(default: None)" not in out


class Words:
    """A tokenizer as steps.chat uses one: token i is the word `w<i>`; no EOS."""

    eos_token_id = None

    def __call__(self, text):
        return {"input_ids": [int(w[1:]) for w in text.split()]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f" w{i}" for i in ids)


class Chatty(Bigram):
    """A bigram model with a parameter (chat reads the device off one): greedy repeats token 1 (0.34
    beats 0.33 and 0.32), as a small GPT repeats a newline; sampling wanders."""

    def __init__(self):
        super().__init__([[0.01, 0.34, 0.33, 0.32]] * 4)
        self.anchor = torch.nn.Parameter(torch.zeros(1))


def test_chat_samples_by_default_seeded_and_greedy_on_request(monkeypatch, capsys):
    """Chat as README runs it samples as nanoGPT's sample.py does (temperature 0.8, top-k 200): one seed
    gives one text, another seed another; --greedy (or --temperature 0) gives the likeliest tokens."""
    import steps.chat as chat

    monkeypatch.setattr(chat, "load", lambda checkpoint, device="cpu": (Chatty(), Words()))

    def said(*args: str) -> str:
        chat.main(["--prompt", "w0", "--max-new-tokens", "24", *args])
        return capsys.readouterr().out.strip()

    greedy = said("--greedy")
    assert greedy == "w0" + " w1" * 24 == said("--temperature", "0")
    sampled = said()
    assert sampled != greedy and len(set(sampled.split())) >= 3  # not one token over and over
    assert said() == sampled == said("--seed", "0")  # the default seed: the same text every time
    assert said("--seed", "1") != sampled
    with pytest.raises(SystemExit):
        chat.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: 0.8)" in help_text and "(default: 200)" in help_text and "--greedy" in help_text


def test_chat_gives_several_completions_and_stops_on_time(monkeypatch, capsys):
    """--num-return-sequences N prints N numbered completions (samples drawn together, or the N best
    beams, the first being --beams' own answer); --max-time stops after the token in flight; greedy with
    N > 1 is one clear usage line, as HF generate refuses it."""
    import steps.chat as chat

    monkeypatch.setattr(chat, "load", lambda checkpoint, device="cpu": (Chatty(), Words()))

    def said(*args: str) -> list[str]:
        chat.main(["--prompt", "w0", "--max-new-tokens", "12", *args])
        return capsys.readouterr().out.strip().splitlines()

    samples = said("--num-return-sequences", "3")
    assert [s[:4] for s in samples] == ["[1] ", "[2] ", "[3] "] and len({s[4:] for s in samples}) == 3
    beams = said("--beams", "4", "--num-return-sequences", "2")
    assert len(beams) == 2 and beams[0][4:] == said("--beams", "4")[0]
    assert said("--max-time", "1e-9") == [said("--max-new-tokens", "1")[0]]  # one token, then the clock
    for bad in (["--greedy", "--num-return-sequences", "2"], ["--beams", "2", "--num-return-sequences", "3"]):
        with pytest.raises(SystemExit):
            said(*bad)
        assert "--num-return-sequences" in capsys.readouterr().err


# ---- HF generate's controls: num_return_sequences and max_time, equal to HF where HF defines the result ----
@pytest.fixture(scope="module")
def hf_and_ours():
    from transformers import GPT2Config, GPT2LMHeadModel

    from steps.models.hf_convert import from_hf

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=100, n_positions=48, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    hf = GPT2LMHeadModel(cfg).eval()  # float32: HF samples from float32 scores, as ours
    return hf, from_hf(hf).eval()


def hf_generate(hf, prompt, **kw):
    return hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), pad_token_id=0, eos_token_id=None, bos_token_id=None, **kw
    )


PROMPT = torch.randint(0, 100, (2, 4), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("kw", [dict(temperature=0.8, top_k=20, top_p=0.9), dict(temperature=1.3, top_k=0)])
def test_seeded_sampling_with_num_return_sequences_equals_hf(hf_and_ours, kw):
    """Same seed, same global RNG: HF's multinomial over its warped float32 scores (temperature, top-k,
    top-p in that order) and ours draw the same tokens, each prompt repeated n times in a row."""
    hf, ours = hf_and_ours
    torch.manual_seed(11)
    ref = hf_generate(hf, PROMPT, do_sample=True, max_new_tokens=12, num_return_sequences=3, **kw)
    torch.manual_seed(11)
    got = generate(ours, PROMPT, 12, do_sample=True, num_return_sequences=3, **{**kw, "top_k": kw["top_k"] or None})
    assert got.shape == (6, 16) and torch.equal(got[::3, :4], PROMPT) and torch.equal(got[1::3, :4], PROMPT)
    assert torch.equal(got, ref)
    assert not torch.equal(got[0], got[1])  # three different samples of one prompt, not copies


def test_greedy_equals_hf_and_refuses_several_sequences_as_hf(hf_and_ours):
    hf, ours = hf_and_ours
    assert torch.equal(generate(ours, PROMPT, 10), hf_generate(hf, PROMPT, do_sample=False, max_new_tokens=10))
    with pytest.raises(ValueError, match="num_return_sequences"):
        hf_generate(hf, PROMPT, do_sample=False, max_new_tokens=3, num_return_sequences=2)
    with pytest.raises(ValueError, match="num_return_sequences"):
        generate(ours, PROMPT, 3, num_return_sequences=2)


def test_beam_search_num_return_sequences_equals_hf(hf_and_ours):
    """The n best of num_beams hypotheses, best first, and their length-normalised scores."""
    hf, ours = hf_and_ours
    ref = hf_generate(
        hf, PROMPT[:1], num_beams=4, num_return_sequences=3, max_new_tokens=8, do_sample=False,
        output_scores=True, return_dict_in_generate=True,
    )  # fmt: skip
    seqs, scores = beam_search(ours, PROMPT[:1], num_beams=4, max_new_tokens=8, num_return_sequences=3)
    assert torch.equal(seqs, ref.sequences)
    assert scores == pytest.approx(ref.sequences_scores.tolist(), abs=1e-5)
    best, best_score = beam_search(ours, PROMPT[:1], num_beams=4, max_new_tokens=8)
    assert torch.equal(best, seqs[:1]) and best_score == scores[0]
    with pytest.raises(ValueError, match="num_beams"):
        beam_search(ours, PROMPT[:1], num_beams=2, num_return_sequences=3)


def test_max_time_zero_gives_one_token_as_hf(hf_and_ours):
    """HF's MaxTimeCriteria checks after each token: max_time=0 stops after the first one; so do we."""
    hf, ours = hf_and_ours
    ref = hf_generate(hf, PROMPT, do_sample=False, max_new_tokens=10, max_time=0.0)
    assert ref.shape == (2, 5) and torch.equal(generate(ours, PROMPT, 10, max_time=0.0), ref)
    assert beam_search(ours, PROMPT[:1], 3, 10, max_time=0.0)[0].shape == (1, 5)
    assert generate(ours, PROMPT, 10, max_time=60.0).shape == (2, 14)  # a generous limit changes nothing


class Slow(Bigram):
    """A bigram model whose every forward takes 50 ms."""

    def forward(self, input_ids, past_key_values=None, use_cache=False):
        time.sleep(0.05)
        return super().forward(input_ids, past_key_values, use_cache)


def test_max_time_stops_a_slow_model_midway():
    out = generate(Slow(TABLE), torch.zeros(1, 1, dtype=torch.long), 100, max_time=0.12, use_cache=False)
    assert 2 <= out.shape[1] - 1 <= 10  # ~3 tokens of 50 ms cross 0.12 s; far fewer than 100
