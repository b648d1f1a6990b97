"""Tree: derived structure (depth, positions, masks, paths), bit packing, choice lists, select; the
tensor-built ancestors and depths against plain loops."""
from __future__ import annotations

import pytest
import torch

from eagle.tree import Tree, ancestors_from_parents, chain_choices, choices_to_parents, pack_bits

from conftest import TINY_VOCAB, make_random_tree, random_parents

V = TINY_VOCAB


# ------------------------------------------------------------------------------------------------
# brute-force references
# ------------------------------------------------------------------------------------------------


def walk_up(parents: list[int], i: int) -> list[int]:
    """Ancestors of i (self included), from i up to the root."""
    out = [i]
    while parents[out[-1]] != -1:
        out.append(parents[out[-1]])
    return out


def brute_ancestor_mask(parents: list[int]) -> torch.Tensor:
    T = len(parents)
    m = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        for j in walk_up(parents, i):
            m[i, j] = True
    return m


def unpack_bits(words: torch.Tensor, S: int) -> torch.Tensor:
    """Inverse of pack_bits with plain bit operations: (..., T, W) int32 -> (..., T, S) bool."""
    w64 = words.to(torch.int64) & 0xFFFFFFFF  # the unsigned 32-bit value of each word
    shifts = torch.arange(32, dtype=torch.int64)
    bits = (w64[..., None] >> shifts) & 1  # (..., T, W, 32)
    return bits.flatten(-2)[..., :S].to(torch.bool)


# ------------------------------------------------------------------------------------------------
# hand-made tree
# ------------------------------------------------------------------------------------------------
#            0 (tok 10)
#          /    |     \
#     1 (11)  2 (12)  3 (13)
#      /  \      |
#   4 (14) 5 (15) 6 (16)
#      |
#   7 (17)
HAND_TOKENS = [10, 11, 12, 13, 14, 15, 16, 17]
HAND_PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4]


@pytest.fixture
def hand():
    return Tree.from_lists(HAND_TOKENS, HAND_PARENTS)


def test_hand_depth_positions(hand):
    assert hand.depth.tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    assert hand.positions(0).tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    assert hand.positions(20).tolist() == [20, 21, 21, 21, 22, 22, 22, 23]
    assert hand.depth.dtype == torch.long
    assert len(hand) == 8


def test_hand_children_leaves_paths(hand):
    assert hand.children() == [[1, 2, 3], [4, 5], [6], [], [7], [], [], []]
    assert hand.leaves() == [3, 5, 6, 7]
    assert hand.paths() == [[0, 3], [0, 1, 5], [0, 2, 6], [0, 1, 4, 7]]
    assert hand.path_to(0) == [0]
    assert hand.path_to(7) == [0, 1, 4, 7]


def test_hand_ancestor_mask(hand):
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0, 0],
        [1, 0, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 0, 0],
        [1, 0, 1, 0, 0, 0, 1, 0],
        [1, 1, 0, 0, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(hand.ancestor_mask(), expected)


def test_chain_tree():
    t = Tree.chain([5, 6, 7, 8])
    assert t.parents.tolist() == [-1, 0, 1, 2]
    assert t.depth.tolist() == [0, 1, 2, 3]
    assert t.paths() == [[0, 1, 2, 3]]
    assert torch.equal(t.ancestor_mask(), torch.ones(4, 4, dtype=torch.bool).tril())
    single = Tree.chain([9])
    assert len(single) == 1 and single.leaves() == [0] and single.paths() == [[0]]
    assert single.ancestor_mask().tolist() == [[True]]


def test_str_contains_every_node(hand):
    s = str(hand)
    assert "T=8" in s and "depth=3" in s
    for i, tok in enumerate(HAND_TOKENS):
        assert f"[{i}] {tok}" in s
    assert len(s.splitlines()) == 1 + len(hand)  # header + one line per node


def test_str_random_tree_contains_every_node():
    gen = torch.Generator().manual_seed(5)
    tree = make_random_tree(40, 1000, gen)
    s = str(tree)
    lines = s.splitlines()[1:]
    for i, tok in enumerate(tree.tokens.tolist()):
        assert sum(line.endswith(f"[{i}] {tok}") for line in lines) == 1


# ------------------------------------------------------------------------------------------------
# random trees vs brute force
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_random_tree_structure(seed):
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 70, (), generator=gen))
    parents = random_parents(n, gen)
    tokens = torch.randint(0, 50, (n,), generator=gen).tolist()
    tree = Tree.from_lists(tokens, parents)

    # depth: the number of steps up to the root; positions = prefix + depth
    depth = [len(walk_up(parents, i)) - 1 for i in range(n)]
    assert tree.depth.tolist() == depth
    assert tree.positions(7).tolist() == [d + 7 for d in depth]

    # ancestor mask vs an explicit walk up the parents
    assert torch.equal(tree.ancestor_mask(), brute_ancestor_mask(parents))

    # children: exactly the nodes that name i as their parent, in index order
    children = tree.children()
    for i in range(n):
        assert children[i] == [j for j in range(n) if parents[j] == i]

    # leaves: nodes nobody points at
    leaves = [i for i in range(n) if i not in set(parents)]
    assert tree.leaves() == leaves

    # paths: one per leaf, root-to-leaf, each step a parent-child edge, covering every node
    paths = tree.paths()
    assert [p[-1] for p in paths] == leaves
    covered = set()
    for p in paths:
        assert p[0] == 0
        assert p == walk_up(parents, p[-1])[::-1]
        assert all(parents[b] == a for a, b in zip(p, p[1:]))
        covered.update(p)
    assert covered == set(range(n))
    for i in range(n):
        assert tree.path_to(i) == walk_up(parents, i)[::-1]


# ------------------------------------------------------------------------------------------------
# pack_bits
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 5, 31, 32, 33, 64, 100])
def test_pack_bits_round_trip(T):
    gen = torch.Generator().manual_seed(T)
    mask = torch.rand(T, T, generator=gen) < 0.5
    mask[:, -1] = True  # the highest bit of the last word is set in every row -> sign bit for T % 32 == 0
    words = pack_bits(mask)
    assert words.dtype == torch.int32
    assert words.shape == (T, (T + 31) // 32)
    assert torch.equal(unpack_bits(words, T), mask)


def test_pack_bits_known_values():
    # bit b of word w is column 32 w + b; bit 31 reinterpreted as the int32 sign
    mask = torch.zeros(3, 64, dtype=torch.bool)
    mask[0, 0] = True
    mask[1, [1, 3, 32]] = True
    mask[2, 31] = True
    mask[2, 63] = True
    words = pack_bits(mask)
    assert words.tolist() == [[1, 0], [0b1010, 1], [-(2**31), -(2**31)]]
    full = pack_bits(torch.ones(2, 40, dtype=torch.bool))
    assert full.tolist() == [[-1, 0xFF]] * 2


def test_pack_bits_leading_dims_and_non_square():
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(2, 3, 7, 70, generator=gen) < 0.3
    words = pack_bits(mask)
    assert words.shape == (2, 3, 7, 3)
    assert torch.equal(unpack_bits(words, 70), mask)


@pytest.mark.parametrize("n", [10, 64, 100])
def test_packed_mask_matches_ancestor_mask(n):
    tree = make_random_tree(n, 100, torch.Generator().manual_seed(n))
    assert torch.equal(unpack_bits(tree.packed_mask(), n), tree.ancestor_mask())


# ------------------------------------------------------------------------------------------------
# choice lists
# ------------------------------------------------------------------------------------------------


def test_chain_choices():
    assert chain_choices(3) == [[0], [0, 0], [0, 0, 0]]
    assert chain_choices(0) == []
    parents, ranks = choices_to_parents(chain_choices(4))
    assert parents == [-1, 0, 1, 2, 3]
    assert ranks == [-1, 0, 0, 0, 0]


def test_choices_to_parents_ordering():
    # deliberately shuffled: deeper paths first, siblings out of order
    choices = [[1, 0], [0, 0, 0], [1], [0, 1], [0], [0, 0], [2]]
    parents, ranks = choices_to_parents(choices)
    # expected node order: depth, then lexicographic
    order = [(), (0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert len(parents) == len(order)
    index = {p: i for i, p in enumerate(order)}
    assert parents == [-1] + [index[p[:-1]] for p in order[1:]]
    assert ranks == [-1] + [p[-1] for p in order[1:]]
    assert all(parents[i] < i for i in range(1, len(parents)))  # parents before children
    Tree.from_lists([0] * len(parents), parents)  # a valid tree


@pytest.mark.parametrize("seed", range(5))
def test_choices_to_parents_random_round_trip(seed):
    """Random tree -> its choice list (shuffled) -> parents: same tree up to node order."""
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(25, gen)
    tree = Tree.from_lists(list(range(25)), parents)
    children = tree.children()
    rank = {c: r for ch in children for r, c in enumerate(ch)}
    path_of = {i: tuple(rank[j] for j in tree.path_to(i)[1:]) for i in range(1, 25)}
    choices = [list(path_of[i]) for i in torch.randperm(24, generator=gen).add(1).tolist()]
    new_parents, ranks = choices_to_parents(choices)
    assert all(new_parents[i] < i for i in range(1, len(new_parents)))
    # rebuild the path of every new node and compare the sets of paths and their parent relation
    new_paths = [()]
    for i in range(1, len(new_parents)):
        new_paths.append(new_paths[new_parents[i]] + (ranks[i],))
    assert sorted(new_paths[1:]) == sorted(path_of.values())
    depths = [len(p) for p in new_paths]
    assert depths == sorted(depths)


@pytest.mark.parametrize("bad, needle", [
    ([[0], [0, 1, 0]], "parent"),  # [0, 1] missing
    ([[1, 0]], "parent"),  # [1] missing
    ([[0], [0]], "duplicate"),
    ([[0], [1], [0, 0], [1]], "duplicate"),
    ([[0], []], "empty"),
    ([[0], [-1]], "negative"),
])
def test_choices_to_parents_errors(bad, needle):
    with pytest.raises(ValueError, match=needle):
        choices_to_parents(bad)


# ------------------------------------------------------------------------------------------------
# select
# ------------------------------------------------------------------------------------------------


def test_select_remaps_parents(hand):
    q = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
    scores = torch.arange(8, dtype=torch.float32) * -1.0
    tree = Tree(hand.tokens, hand.parents, q, scores)
    sub = tree.select(torch.tensor([7, 0, 4, 1, 2]))  # unsorted on purpose
    # kept (sorted): 0, 1, 2, 4, 7 -> new indices 0..4
    assert sub.tokens.tolist() == [10, 11, 12, 14, 17]
    assert sub.parents.tolist() == [-1, 0, 0, 1, 3]
    assert torch.equal(sub.q, q[[0, 1, 2, 4, 7]])
    assert torch.equal(sub.scores, scores[[0, 1, 2, 4, 7]])
    assert sub.paths() == [[0, 2], [0, 1, 3, 4]]


@pytest.mark.parametrize("seed", range(6))
def test_select_random_ancestor_closed(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    tree = make_random_tree(30, 1000, gen, distinct_siblings=False)
    # a random ancestor-closed set: the union of the paths to a few random nodes
    targets = torch.randint(0, 30, (4,), generator=gen).tolist()
    keep = sorted({j for t in targets for j in tree.path_to(t)})
    sub = tree.select(torch.tensor(keep))
    old_par = tree.parents.tolist()
    assert sub.tokens.tolist() == [tree.tokens.tolist()[k] for k in keep]
    for new_i, old_i in enumerate(keep):
        if new_i == 0:
            assert sub.parents.tolist()[0] == -1
        else:
            assert keep[sub.parents.tolist()[new_i]] == old_par[old_i]
    assert sub.q is None and sub.scores is None


def test_select_errors(hand):
    with pytest.raises(ValueError):
        hand.select(torch.tensor([0, 4]))  # 4's parent 1 is missing
    with pytest.raises(ValueError):
        hand.select(torch.tensor([1, 4]))  # no root


# ------------------------------------------------------------------------------------------------
# invalid trees
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens, parents", [
    ([1, 2, 3], [0, 0, 1]),  # root's parent is not -1
    ([1, 2, 3], [-1, 1, 0]),  # node 1 is its own parent
    ([1, 2, 3], [-1, 2, 0]),  # parent after child
    ([1, 2, 3], [-1, 0, -1]),  # a second root
    ([1, 2, 3], [-1, 0, 5]),  # out of range
    ([1, 2, 3], [-1, 0]),  # length mismatch
    ([], []),  # no root
])
def test_invalid_trees_raise(tokens, parents):
    with pytest.raises(ValueError):
        Tree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))


def test_invalid_shapes_raise():
    with pytest.raises(ValueError):
        Tree(torch.zeros(2, 2, dtype=torch.long), torch.tensor([[-1, 0], [0, 1]]))
    with pytest.raises(ValueError):
        Tree(torch.tensor([1, 2]), torch.tensor([-1, 0]), q=torch.full((3, 5), 0.2))
    Tree(torch.tensor([1, 2]), torch.tensor([-1, 0]), q=torch.full((2, 5), 0.2))  # the valid variant


# ------------------------------------------------------------------------------------------------
# tree structure as tensor ops: against plain loops
# ------------------------------------------------------------------------------------------------


def loop_ancestors(parents: list[int]) -> torch.Tensor:
    """The obvious reference: each node's row is its parent's row plus itself."""
    T = len(parents)
    anc = torch.eye(T, dtype=torch.bool)
    for i in range(1, T):
        anc[i] |= anc[parents[i]]
    return anc


def loop_depth(parents: list[int]) -> list[int]:
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


@pytest.mark.parametrize("T", [1, 2, 3, 7, 16, 33, 64, 100])
def test_ancestors_and_depth_match_loops(T):
    gen = torch.Generator().manual_seed(T)
    for trial in range(5):
        tree = make_random_tree(T, V, gen, distinct_siblings=False)
        par = tree.parents.tolist()
        assert torch.equal(ancestors_from_parents(tree.parents), loop_ancestors(par))
        assert torch.equal(tree.ancestor_mask(), loop_ancestors(par))
        assert tree.depth.tolist() == loop_depth(par)
        assert tree.positions(7).tolist() == [7 + d for d in loop_depth(par)]
    chain = Tree.chain(list(range(T)))  # the deepest case: T - 1 doublings' worth of distance
    assert chain.depth.tolist() == list(range(T))
    assert torch.equal(chain.ancestor_mask(), torch.ones(T, T, dtype=torch.bool).tril())


def test_tree_structure_is_computed_once():
    tree = make_random_tree(20, V, torch.Generator().manual_seed(0))
    assert tree.ancestor_mask() is tree.ancestor_mask() and tree.depth is tree.depth
