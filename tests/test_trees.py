"""Tests for specdec.trees: compiling tree choices, presets, and the per-row helpers for dynamic trees."""
from __future__ import annotations

import doctest
import random
from dataclasses import FrozenInstanceError

import pytest
import torch
from tiny_models import random_forest

from specdec import trees
from specdec.trees import (
    EAGLE_MC_SIM_7B_63,
    MEDUSA_MC_SIM_7B_63,
    TREE_PRESETS,
    Tree,
    ancestor_matrix,
    chain_tree,
    compile_tree,
    depths_from_parents,
    retrieve_paths,
    validate_parents,
)

# ---- independent references (written from the research notes, not from the module) ----------------------


def vllm_level_counts(choices):
    """vLLM's definitions (``vllm/config/speculative.py`` post-init + ``EagleProposer.__init__`` in
    ``vllm/v1/spec_decode/eagle.py``): paths sorted by ``(len, path)``, children per level = ratio of level counts."""
    tree_choices = sorted((tuple(c) for c in choices), key=lambda t: (len(t), t))
    tree_depth = len(tree_choices[-1])
    num_drafts_per_level = [0] * tree_depth
    for node in tree_choices:
        num_drafts_per_level[len(node) - 1] += 1
    cu_drafts_per_level = [num_drafts_per_level[0]]
    child_drafts_per_level = [num_drafts_per_level[0]]
    for level in range(1, tree_depth):
        cu_drafts_per_level.append(cu_drafts_per_level[-1] + num_drafts_per_level[level])
        child_drafts_per_level.append(int(num_drafts_per_level[level] / num_drafts_per_level[level - 1]))
    return tuple(num_drafts_per_level), tuple(cu_drafts_per_level), tuple(child_drafts_per_level)


def medusa_retrieve_rows(choices):
    """Medusa's retrieve_indices rows (``generate_medusa_buffers``, ``medusa/model/utils.py``): walk the sorted
    paths from the last, skip paths already covered as prefixes, map prefixes to node indices, root column first."""
    ordered = sorted((tuple(c) for c in choices), key=lambda t: (len(t), t))
    covered, rows = set(), []
    for path in reversed(ordered):
        if path in covered:
            continue
        rows.append([0] + [ordered.index(path[:c]) + 1 for c in range(1, len(path) + 1)])
        covered.update(path[:c] for c in range(1, len(path) + 1))
    depth = max(len(r) for r in rows)
    return [r + [-1] * (depth - len(r)) for r in rows]


def node_paths(tree):
    return [()] + list(tree.choices)


def walk_ancestors(parents, i):
    """Node i and its ancestors, following parents one step at a time."""
    out = [i]
    while i > 0 and parents[i] >= 0:
        i = parents[i]
        out.append(i)
    return out


def random_choices(rng, num_nodes, max_rank=3, max_depth=5):
    """A random valid tree: repeatedly give a random node its next-ranked child."""
    paths, next_rank = [], {(): 0}
    while len(paths) < num_nodes:
        parent = rng.choice([p for p in next_rank if len(p) < max_depth and next_rank[p] <= max_rank])
        child = parent + (next_rank[parent],)
        next_rank[parent] += 1
        next_rank[child] = 0
        paths.append(child)
    return paths


def full_tree(width, depth):
    level, out = [()], []
    for _ in range(depth):
        level = [p + (r,) for p in level for r in range(width)]
        out += level
    return out


PRESET_COUNTS = {
    # name: (N, nodes per level, leaves); EAGLE's ``choices.py`` (25 paths) and Medusa's ``medusa_choices.py`` (63)
    "eagle_mc_sim_7b_63": (25, (4, 8, 8, 3, 2), 15),
    "medusa_mc_sim_7b_63": (63, (10, 28, 23, 2), 42),
    "medusa_vicuna_7b_stage2": (63, (10, 23, 23, 7), 42),
    "medusa_vicuna_7b_stage1": (63, (10, 32, 20, 1), 44),
    "medusa_vicuna_7b_stage1_ablation": (63, (10, 21, 25, 7), 42),
    "medusa_vicuna_13b_stage2": (63, (10, 19, 25, 9), 42),
    "medusa_vicuna_13b_stage1": (63, (10, 29, 23, 1), 44),
    "medusa_vicuna_33b_stage2": (63, (10, 24, 24, 5), 43),
    "medusa_vicuna_33b_stage1": (63, (10, 34, 19), 46),
    "medusa_zephyr_stage2": (63, (10, 27, 23, 3), 44),
}

SAMPLE_TREES = {
    **{name: list(choices) for name, choices in TREE_PRESETS.items()},
    "chain_1": [(0,)],
    "chain_5": [(0,) * d for d in range(1, 6)],
    "full_3x2": full_tree(3, 2),
    "full_2x3": full_tree(2, 3),
    "vllm_doc": [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)],
    "lopsided": [(0,), (1,), (2,), (0, 0), (0, 0, 0), (0, 0, 1)],
    **{f"random_{s}": random_choices(random.Random(s), 3 + 7 * s) for s in range(4)},
}


# ---- compile_tree: counts, order, forms --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESET_COUNTS))
def test_preset_counts_are_exactly_the_published_ones(name):
    num_nodes, per_level, num_leaves = PRESET_COUNTS[name]
    tree = compile_tree(TREE_PRESETS[name])
    assert len(TREE_PRESETS[name]) == num_nodes
    assert tree.num_nodes == num_nodes
    assert tree.num_drafts_per_level == per_level
    assert tree.max_depth == len(per_level)
    assert tree.num_leaves == num_leaves
    assert tuple(tree.retrieve_indices.shape) == (num_leaves, len(per_level) + 1)


def test_preset_constants_are_tuples_of_tuples_and_named_as_published():
    assert EAGLE_MC_SIM_7B_63 is TREE_PRESETS["eagle_mc_sim_7b_63"]
    assert MEDUSA_MC_SIM_7B_63 is TREE_PRESETS["medusa_mc_sim_7b_63"]
    for choices in TREE_PRESETS.values():
        assert isinstance(choices, tuple) and all(isinstance(p, tuple) for p in choices)
    with pytest.raises(TypeError):
        TREE_PRESETS["mine"] = ((0,),)  # read-only mapping
    assert trees.MEDUSA_VICUNA_7B_STAGE2 is TREE_PRESETS["medusa_vicuna_7b_stage2"]


def test_medusa_mc_sim_7b_63_attention_mask_has_207_ones():
    # Medusa's generate_medusa_buffers: medusa_attn_mask for mc_sim_7b_63 is 64x64 with 207 ones.
    mask = compile_tree(MEDUSA_MC_SIM_7B_63).ancestor_mask
    assert tuple(mask.shape) == (64, 64) and int(mask.sum()) == 207


@pytest.mark.parametrize("name", sorted(SAMPLE_TREES))
def test_level_counts_equal_vllm_definitions(name):
    choices = SAMPLE_TREES[name]
    tree = compile_tree(choices)
    drafts, cu, child = vllm_level_counts(choices)
    assert tree.num_drafts_per_level == drafts
    assert tree.cu_drafts_per_level == cu
    assert tree.child_drafts_per_level == child
    assert tree.cu_drafts_per_level[-1] == tree.num_nodes


@pytest.mark.parametrize("name", sorted(SAMPLE_TREES))
def test_num_children_is_exact_and_uniform_fan_out_flags_vllm_assumption(name):
    tree = compile_tree(SAMPLE_TREES[name])
    paths = node_paths(tree)
    exact = [sum(1 for q in paths[1:] if q[:-1] == p) for p in paths]
    assert tree.num_children.tolist() == exact
    # vLLM's child_drafts_per_level is right for every node iff the fan-out is uniform per level.
    uniform = all(
        exact[i] == tree.child_drafts_per_level[len(p)]
        for i, p in enumerate(paths)
        if len(p) < tree.max_depth
    )
    assert tree.uniform_fan_out == uniform


def test_uniform_fan_out_on_known_trees():
    assert compile_tree(full_tree(3, 2)).uniform_fan_out
    assert compile_tree(full_tree(3, 2)).child_drafts_per_level == (3, 3)
    assert chain_tree(4).uniform_fan_out and chain_tree(4).child_drafts_per_level == (1, 1, 1, 1)
    assert not compile_tree(EAGLE_MC_SIM_7B_63).uniform_fan_out
    assert not compile_tree(MEDUSA_MC_SIM_7B_63).uniform_fan_out


@pytest.mark.parametrize("seed", range(3))
def test_shuffled_list_input_gives_the_same_tree(seed):
    choices = list(MEDUSA_MC_SIM_7B_63)
    random.Random(seed).shuffle(choices)
    as_lists = [list(p) for p in choices]
    a, b, c = compile_tree(MEDUSA_MC_SIM_7B_63), compile_tree(choices), compile_tree(as_lists)
    assert a == b == c and hash(a) == hash(b) == hash(c)
    for name in ("parents", "depths", "ranks", "num_children", "leaves", "retrieve_indices", "ancestor_mask"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_string_form_equals_list_form():
    text = "[(0,), (1,), (0,0), (0,1), (1,0), (1,1)]"  # vLLM docs' speculative_token_tree example
    assert compile_tree(text) == compile_tree([(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)])
    assert compile_tree(str(list(MEDUSA_MC_SIM_7B_63))) == compile_tree(MEDUSA_MC_SIM_7B_63)
    assert compile_tree("[[0], [0, 0], [1]]") == compile_tree([(0,), (1,), (0, 0)])  # Medusa's list form


def test_choices_are_sorted_breadth_first_then_by_path():
    tree = compile_tree(EAGLE_MC_SIM_7B_63)
    assert list(tree.choices) == sorted(EAGLE_MC_SIM_7B_63, key=lambda t: (len(t), t))
    parents = tree.parents.tolist()
    assert all(parents[i] < i for i in range(1, tree.num_nodes + 1))
    # Children of a node are contiguous and in rank order.
    for node in range(tree.num_nodes + 1):
        kids = [i for i in range(1, tree.num_nodes + 1) if parents[i] == node]
        if kids:
            assert kids == list(range(kids[0], kids[0] + len(kids)))
        assert [tree.ranks[k].item() for k in kids] == list(range(len(kids)))


@pytest.mark.parametrize("name", sorted(SAMPLE_TREES))
def test_parents_depths_ranks_follow_the_paths(name):
    tree = compile_tree(SAMPLE_TREES[name])
    paths = node_paths(tree)
    assert tree.parents.tolist() == [-1] + [paths.index(p[:-1]) for p in paths[1:]]
    assert tree.depths.tolist() == [len(p) for p in paths]
    assert torch.equal(tree.position_offsets, tree.depths)
    assert tree.ranks.tolist() == [0] + [p[-1] for p in paths[1:]]
    for t in (tree.parents, tree.depths, tree.ranks, tree.num_children, tree.leaves, tree.retrieve_indices):
        assert t.dtype == torch.long and t.device.type == "cpu"
    assert tree.ancestor_mask.dtype == torch.bool


@pytest.mark.parametrize(
    "choices, words",
    [
        ([], ["empty", "chain_tree(0)"]),
        ("", ["could not parse"]),
        ("[(0,), (1,", ["could not parse", "[(0,), (1,), (0, 0)]"]),
        ("{'a': 1}", ["list of paths"]),
        (42, ["list of paths"]),
        ([(0,), ()], ["empty path", "root is implicit"]),
        ([0, 1], ["entry #0", "not a path"]),
        ([(0,), "01"], ["entry #1", "not a path"]),
        ([(0,), (0, "1")], ["(0, '1')", "not an int"]),
        ([(0,), (0, 1.0)], ["(0, 1.0)", "not an int"]),
        ([(True,)], ["(True,)", "not an int"]),
        ([(0,), (-1,)], ["(-1,)", "negative rank"]),
        ([(0,), (1,), (0,)], ["(0,)", "twice", "#0", "#2"]),
        ([(0,), (1, 0)], ["(1, 0)", "no parent", "add (1,)"]),
        ([(0,), (1, 0, 0)], ["(1, 0, 0)", "prefix (1,) is missing"]),
        ([(0,), (2,)], ["(2,)", "skips rank 1", "add (1,)"]),
        ([(1,)], ["(1,)", "skips rank 0", "add (0,)"]),
        ([(0,), (0, 0), (0, 1, 0)], ["(0, 1, 0)", "no parent", "add (0, 1)"]),
        ([(0,), (0, 0), (0, 2)], ["(0, 2)", "skips rank 1", "(0, 1)"]),
    ],
)
def test_malformed_choices_raise_naming_the_path_and_the_fix(choices, words):
    with pytest.raises(ValueError) as info:
        compile_tree(choices)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_error_does_not_depend_on_input_order():
    bad = [(0,), (2,), (0, 0), (3, 0), (1, 5)]
    messages = set()
    for seed in range(5):
        shuffled = list(bad)
        random.Random(seed).shuffle(shuffled)
        with pytest.raises(ValueError) as info:
            compile_tree(shuffled)
        messages.add(str(info.value))
    assert len(messages) == 1


def test_compile_tree_passes_a_tree_through_and_the_constructor_validates_too():
    tree = compile_tree([(0,)])
    assert isinstance(tree, Tree) and compile_tree(tree) is tree
    assert Tree([[1], [0]]).choices == ((0,), (1,))
    assert Tree(()) == chain_tree(0)
    with pytest.raises(ValueError, match="skips rank 0"):
        Tree(((1,),))


def test_chain_tree_is_the_chain_of_paths():
    for k in range(1, 6):
        tree = chain_tree(k)
        assert tree == compile_tree([(0,) * d for d in range(1, k + 1)])
        assert tree.parents.tolist() == list(range(-1, k))
        assert tree.retrieve_indices.tolist() == [list(range(k + 1))]
        assert torch.equal(tree.ancestor_mask, torch.ones(k + 1, k + 1, dtype=torch.bool).tril())
        assert tree.num_drafts_per_level == (1,) * k and tree.cu_drafts_per_level == tuple(range(1, k + 1))


def test_chain_tree_zero_is_the_root_only_tree():
    tree = chain_tree(0)
    assert tree.num_nodes == 0 and tree.max_depth == 0 and tree.choices == ()
    assert tree.parents.tolist() == [-1] and tree.retrieve_indices.tolist() == [[0]]
    assert tree.leaves.tolist() == [0] and tree.ancestor_mask.tolist() == [[True]]
    assert tree.num_drafts_per_level == tree.cu_drafts_per_level == tree.child_drafts_per_level == ()
    with pytest.raises(ValueError, match="num_drafts"):
        chain_tree(-1)


@pytest.mark.parametrize("name", sorted(SAMPLE_TREES))
def test_retrieve_indices_rows_are_exactly_the_root_to_leaf_paths(name):
    tree = compile_tree(SAMPLE_TREES[name])
    paths = node_paths(tree)
    parents = tree.parents.tolist()
    leaves = [i for i in range(1, len(paths)) if i not in parents]
    rows = tree.retrieve_indices.tolist()
    assert sorted(tree.leaves.tolist()) == sorted(leaves)
    for row, leaf in zip(rows, tree.leaves.tolist()):
        walk = walk_ancestors(parents, leaf)[::-1]
        assert row == walk + [-1] * (tree.max_depth + 1 - len(walk))
    # EAGLE order: rows sorted lexicographically by node index (padding last), = leaves' paths in DFS order.
    assert rows == sorted(rows, key=lambda r: [x if x >= 0 else 10**9 for x in r])
    assert [paths[leaf] for leaf in tree.leaves.tolist()] == sorted(paths[leaf] for leaf in leaves)
    # Same rows as Medusa's generate_medusa_buffers, in another order.
    assert sorted(rows) == sorted(medusa_retrieve_rows(SAMPLE_TREES[name]))


@pytest.mark.parametrize("name", sorted(SAMPLE_TREES))
def test_ancestor_mask_matches_a_brute_force_walk(name):
    tree = compile_tree(SAMPLE_TREES[name])
    parents = tree.parents.tolist()
    expected = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i in range(len(parents)):
        expected[i, walk_ancestors(parents, i)] = True
    assert torch.equal(tree.ancestor_mask, expected)


def test_prune_keeps_nodes_up_to_a_depth_with_the_same_indices():
    tree = compile_tree(EAGLE_MC_SIM_7B_63)
    assert tree.prune(5) is tree and tree.prune(99) is tree
    for depth in range(0, 5):
        small = tree.prune(depth)
        assert small.max_depth == depth
        assert small.choices == tuple(p for p in tree.choices if len(p) <= depth)
        n = small.num_nodes + 1
        assert torch.equal(small.parents, tree.parents[:n])
        assert torch.equal(small.ancestor_mask, tree.ancestor_mask[:n, :n])
    assert tree.prune(0) == chain_tree(0)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_depth"):
            tree.prune(bad)


def test_tree_is_immutable_and_equal_by_choices():
    a, b = compile_tree([(0,), (1,)]), compile_tree([(1,), (0,)])
    assert a == b and hash(a) == hash(b) and len({a, b, chain_tree(1)}) == 2
    assert a != chain_tree(2) and a != [(0,), (1,)]
    with pytest.raises(FrozenInstanceError):
        a.choices = ((0,),)
    with pytest.raises(AttributeError):
        a.parents = torch.zeros(3)
    assert "num_nodes=2" in repr(a)


def test_to_moves_every_tensor_and_keeps_equality():
    tree = compile_tree(EAGLE_MC_SIM_7B_63)
    assert tree.to("cpu") is tree
    moved = tree.to("meta")
    assert moved == tree and moved.device.type == "meta"
    for name in ("parents", "depths", "ranks", "num_children", "leaves", "retrieve_indices", "ancestor_mask"):
        assert getattr(moved, name).device.type == "meta"
        assert getattr(tree, name).device.type == "cpu"
    assert compile_tree(tree, device="meta").device.type == "meta"


def test_expand_gives_the_draft_layout():
    tree = compile_tree(EAGLE_MC_SIM_7B_63)
    parents, depths = tree.expand(3)
    assert parents.shape == depths.shape == (3, 26)
    assert torch.equal(parents, tree.parents.repeat(3, 1)) and torch.equal(depths, tree.depths.repeat(3, 1))
    parents[0, 5] = -1  # fresh tensors: modifying them leaves the tree alone
    assert tree.parents[5] >= 0
    with pytest.raises(ValueError, match="batch_size"):
        tree.expand(0)


# ---- per-row helpers for dynamic trees ---------------------------------------------------------------------


@pytest.mark.parametrize("num_nodes", [0, 1, 2, 7, 12, 33])
def test_batch_helpers_match_a_brute_force_walk_on_random_forests(num_nodes):
    rng = random.Random(num_nodes)
    parents = random_forest(rng, batch=3, num_nodes=num_nodes)
    validate_parents(parents)
    depths = depths_from_parents(parents)
    anc = ancestor_matrix(parents)
    paths, is_leaf = retrieve_paths(parents)
    assert anc.shape == (3, num_nodes + 1, num_nodes + 1) and anc.dtype == torch.bool
    for b, row in enumerate(parents.tolist()):
        present = [i == 0 or p >= 0 for i, p in enumerate(row)]
        for i in range(num_nodes + 1):
            walk = walk_ancestors(row, i)
            assert depths[b, i] == len(walk) - 1
            assert anc[b, i].nonzero().flatten().tolist() == sorted(walk)
            expected_path = walk[::-1] if present[i] else []
            assert paths[b, i].tolist() == expected_path + [-1] * (num_nodes + 1 - len(expected_path))
            has_child = any(row[j] == i for j in range(1, num_nodes + 1))
            assert bool(is_leaf[b, i]) == (present[i] and not has_child)


def test_batch_helpers_agree_with_the_tree_buffers():
    tree = compile_tree(MEDUSA_MC_SIM_7B_63)
    parents = tree.parents[None]
    assert torch.equal(depths_from_parents(parents)[0], tree.depths)
    assert torch.equal(ancestor_matrix(parents)[0], tree.ancestor_mask)
    paths, is_leaf = retrieve_paths(parents, max_depth=tree.max_depth)
    assert torch.equal(paths[0, tree.leaves], tree.retrieve_indices)
    assert torch.equal(is_leaf[0].nonzero().flatten(), tree.leaves.sort().values)


def test_absent_nodes_see_only_themselves_and_have_depth_zero():
    parents = torch.tensor([[-1, 0, -1, 1, -1]])
    assert depths_from_parents(parents).tolist() == [[0, 1, 0, 2, 0]]
    anc = ancestor_matrix(parents)[0]
    assert anc[2].nonzero().flatten().tolist() == [2] and anc[4].nonzero().flatten().tolist() == [4]
    assert anc[3].nonzero().flatten().tolist() == [0, 1, 3]


@pytest.mark.parametrize(
    "parents, words",
    [
        ([[0, 0]], ["parents[0, 0] = 0", "must be -1"]),
        ([[-1, 0], [-1, 1]], ["parents[1, 1] = 1", "come before it"]),
        ([[-1, 0, 3, 1]], ["parents[0, 2] = 3", "come before it"]),
        ([[-1, -2]], ["parents[0, 1] = -2", "-1 for an absent node"]),
        ([[-1, -1, 1]], ["parents[0, 2] = 1", "absent", "mark node 2 absent"]),
    ],
)
def test_validate_parents_names_the_row_node_and_fix(parents, words):
    with pytest.raises(ValueError) as info:
        validate_parents(torch.tensor(parents))
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize(
    "bad, error",
    [(torch.tensor([-1, 0]), ValueError), (torch.tensor([[-1.0, 0.0]]), ValueError), ([[-1, 0]], TypeError)],
)
def test_batch_helpers_reject_bad_shapes_and_dtypes(bad, error):
    for fn in (validate_parents, depths_from_parents, ancestor_matrix, retrieve_paths):
        with pytest.raises(error, match="parents"):
            fn(bad)


def test_batch_helpers_need_no_host_sync():
    # Meta tensors have no values: any .item(), bool() or data-dependent shape would raise.
    parents = torch.empty(4, 30, dtype=torch.long, device="meta")
    assert depths_from_parents(parents).shape == (4, 30)
    assert ancestor_matrix(parents).shape == (4, 30, 30)
    paths, is_leaf = retrieve_paths(parents, max_depth=6)
    assert paths.shape == (4, 30, 7) and is_leaf.shape == (4, 30)


@pytest.mark.parametrize("module", ["specdec.trees.core", "specdec.masks"])
def test_docstring_examples_run(module):
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
