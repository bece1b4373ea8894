"""Packed forwards split a batch's rows into one group per thread: each row's logits, cache and
ids are what one forward over the whole batch gives, and the split keeps one-sided batches whole."""

from __future__ import annotations

import copy

import pytest
import torch

from turngym.agents.packed import PackedLM, single_thread_pool


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _rows(packed: PackedLM, pasts: list[int], news: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    vocab = packed.runner.get_input_embeddings().weight.shape[0]
    caches = []
    for r, p in enumerate(pasts):
        c = packed.new_cache(0, 8, r)
        if p:
            packed.forward([c], [torch.randint(0, vocab, (p,), generator=g).tolist()])
        caches.append(c)
    return caches, [torch.randint(0, vocab, (n,), generator=g).tolist() for n in news]


def test_row_groups_compute_what_one_forward_computes(tiny_model, two_threads):
    packed = PackedLM(copy.deepcopy(tiny_model.model))
    pasts, news = [0, 5, 12, 3, 9], [7, 1, 4, 3, 6]
    assert len(packed.row_groups(news, torch.device("cpu"))) == 2
    whole, grouped = _rows(packed, pasts, news), _rows(packed, pasts, news)
    packed.split_rows = False
    want = packed.forward(*whole, tail=[2, 1, 3, 1, 2])
    packed.split_rows = True
    got = packed.forward(*grouped, tail=[2, 1, 3, 1, 2])
    assert got.shape == want.shape == (9, want.shape[1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # row after row, in the callers' order
    for a, b, p, n in zip(whole[0], grouped[0], pasts, news):
        assert a.ids == b.ids and len(b.ids) == p + n
        for ka, kb in zip(a.keys + a.values, b.keys + b.values):
            torch.testing.assert_close(ka[:, : p + n], kb[:, : p + n])


def test_row_groups_balance_tokens_and_keep_lopsided_batches_whole(tiny_model, two_threads):
    packed = PackedLM(copy.deepcopy(tiny_model.model))
    cpu = torch.device("cpu")
    groups = packed.row_groups([4] * 6, cpu)
    assert sorted(len(g) for g in groups) == [3, 3] and sorted(sum(groups, [])) == list(range(6))
    assert all(g == sorted(g) for g in groups)  # rows keep their order within a group
    assert packed.row_groups([200, 4, 4, 4], cpu) == [[0, 1, 2, 3]]  # one long prefill: all threads on it
    assert packed.row_groups([10], cpu) == [[0]]
    packed.split_rows = False
    assert packed.row_groups([4] * 6, cpu) == [list(range(6))]
    torch.set_num_threads(1)
    packed.split_rows = True
    assert packed.row_groups([4] * 6, cpu) == [list(range(6))]


def test_row_group_workers_run_on_one_thread_and_leave_the_callers_alone(two_threads):
    pool = single_thread_pool(2)
    assert [f.result() for f in [pool.submit(torch.get_num_threads) for _ in range(4)]] == [1, 1, 1, 1]
    assert torch.get_num_threads() == 2
