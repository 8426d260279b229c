"""Candidate trees on llama.cpp (one unified KV, branch sequence ids): each path's logits equal its
chain's, the kept path continues exactly as a chain, and tree decoding equals plain decoding."""
import pytest

pytest.importorskip("llama_cpp")

from draftwise.drafters.suffix import SuffixDrafter  # noqa: E402
from draftwise.engine import Engine  # noqa: E402
from draftwise.models.load import load_llama  # noqa: E402


@pytest.fixture(scope="module")
def runners():
    chain, tok = load_llama("smollm2-135m", n_seq_max=1)
    tree, _ = load_llama("smollm2-135m", trees=True)
    yield chain, tree, tok
    chain.close()
    tree.close()


def _chain(runner, prefix, path, after):
    s = runner.new_sequence()
    runner.forward([s], [prefix], [0])
    rows = runner.forward([s], [path], [len(path)])[0]
    out = [runner.forward([s], [[t]], [1])[0] for t in after]
    runner.free(s)
    return rows, out


@pytest.mark.parametrize("rows", [[2, 4], [1, 3], [2], []])
def test_a_kept_path_continues_exactly_as_its_chain(runners, rows):
    chain, tree, tok = runners
    prompt = tok.encode("def add(a, b):\n    return")
    fed, parents = [prompt[-1], 264, 287, 300, 301], [-1, 0, 0, 1, 2]
    s = tree.new_sequence()
    tree.forward([s], [prompt[:-1]], [0])
    n = tree.length(s)
    logits = tree.forward([s], [fed], [5], [parents])[0]
    assert tree.length(s) == n + 5
    with pytest.raises(ValueError, match="unverified tree"):
        tree.forward([s], [[1]], [1])
    with pytest.raises(ValueError, match="not a path"):
        tree.keep(s, n + 1, [n + 1, n + 2])  # siblings
    tree.keep(s, n + 1, [n + r for r in rows])
    assert tree.length(s) == n + 1 + len(rows)
    after = [tree.forward([s], [[t]], [1])[0] for t in (55, 56, 57)]
    tree.free(s)
    want_rows, want_after = _chain(chain, prompt[:-1], [fed[0]] + [fed[r] for r in rows], (55, 56, 57))
    assert (logits[[0] + rows] == want_rows).all()  # bit-identical
    assert all((a == b).all() for a, b in zip(after, want_after))


def test_trees_need_one_sequence_and_a_tree_runner(runners):
    chain, _, _ = runners
    s = chain.new_sequence()
    with pytest.raises(ValueError, match="chains only"):
        chain.forward([s], [[1, 2, 3]], [3], [[-1, 0, 0]])
    chain.free(s)
    with pytest.raises(ValueError, match="one sequence at a time"):
        load_llama("smollm2-135m", trees=True, n_seq_max=2)


@pytest.mark.parametrize("which", ["editeval", "humaneval"])
def test_tree_decoding_replayed_as_chains_is_bit_identical(runners, which):
    """Decode with suffix-tree on the tree runner, logging every forward and rollback; replay the
    accepted paths as chains on the chain runner: every row the loop read is bit-identical (dead
    branches interleaved in the KV and later rollbacks included), and the output is plain's."""
    from draftwise.prompts import edit_eval, humaneval
    chain, tree, tok = runners
    # editeval: rollbacks after trees that kept only their root; humaneval: a tree keeps 3 nodes
    ids = (edit_eval(1)[0] if which == "editeval" else humaneval(2)[1]).token_ids(tok)
    log, fwd, keep, trunc = [], tree.forward, tree.keep, tree.truncate

    def forward(seqs, toks, ks, parents=None):
        out = fwd(seqs, toks, ks, parents)
        log.append(("fwd", toks[0], ks[0], parents[0] if parents else None, out[0].clone()))
        return out
    tree.forward = forward
    tree.keep = lambda s, n, rows: (log.append(("keep", n, rows)), keep(s, n, rows))[1]
    tree.truncate = lambda s, n: (log.append(("trunc", n)), trunc(s, n))[1]
    try:
        spec = Engine(tree, tok, SuffixDrafter(tree=True), 8).generate(ids, max_tokens=64)
    finally:
        del tree.forward, tree.keep, tree.truncate
    plain = Engine(chain, tok).generate(ids, max_tokens=64)
    assert spec.token_ids == plain.token_ids
    s, i, trees = chain.new_sequence(), 0, 0
    while i < len(log):
        kind, *e = log[i]
        if kind == "trunc":
            chain.truncate(s, e[0])
        elif e[2] is None:
            out = chain.forward([s], [e[0]], [e[1]])[0]
            assert (out == e[3][len(e[3]) - e[1]:]).all()
        else:  # a tree, then its keep: the root and the kept rows, as one chain
            n0, (_, _, rows) = chain.length(s), log[i + 1]
            path = [0] + [r - n0 for r in rows]
            out = chain.forward([s], [[e[0][j] for j in path]], [len(path)])[0]
            assert (out == e[3][path]).all(), f"tree round {trees}"
            trees, i = trees + 1, i + 1
        i += 1
    chain.free(s)
    assert trees > 0 and spec.stats.accepted_draft_tokens > 0


def test_a_cached_prompt_on_the_tree_runner_decodes_as_the_first_time(runners):
    """The unified KV with branch ids and a graveyard: a saved prompt restored into a fresh
    sequence takes the first free cells in order, and tree decoding after it is plain's."""
    from draftwise.prompts import humaneval
    chain, tree, tok = runners
    ids = humaneval(2)[1].token_ids(tok)
    eng = Engine(tree, tok, SuffixDrafter(tree=True), 8, prompt_cache_bytes=64 << 20, max_running=1)
    eng.generate(ids[:-5], max_tokens=8)  # its prompt is kept; its answer is not this one's
    spec = eng.generate(ids, max_tokens=48)
    assert spec.stats.cached_tokens == len(ids) - 5 and spec.stats.tree_rounds > 0
    assert spec.token_ids == Engine(chain, tok).generate(ids, max_tokens=48).token_ids
    assert tree.kv_bytes() < 64  # no cells held (a state header): the cache keeps copies
