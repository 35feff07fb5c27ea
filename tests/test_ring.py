"""The ring all-reduce schedule that lesson 03 draws and implements."""

import pytest

from ddp_lib.figures import ring

SIZES = range(2, 9)


@pytest.mark.parametrize("n", SIZES)
def test_two_phases_of_n_minus_one_steps(n):
    steps = ring.schedule(n)
    assert len(steps) == 2 * (n - 1)
    assert [s.phase for s in steps] == ([ring.SCATTER_REDUCE] * (n - 1)
                                        + [ring.ALL_GATHER] * (n - 1))
    assert [s.index for s in steps] == list(range(2 * (n - 1)))
    assert all(s.world_size == n for s in steps)


@pytest.mark.parametrize("n", SIZES)
def test_every_rank_sends_one_chunk_to_its_right_neighbour_each_step(n):
    for step in ring.schedule(n):
        assert len(step.send) == len(step.recv) == n
        for r in range(n):
            # what r receives is exactly what its left neighbour sends
            assert step.recv[r] == step.send[ring.left(r, n)]
            assert step.recv[ring.right(r, n)] == step.send[r]
        # every chunk is in flight on exactly one link: the links are all busy, none twice
        assert sorted(step.send) == list(range(n))


@pytest.mark.parametrize("n", SIZES)
def test_every_rank_ends_with_every_chunk_fully_reduced(n):
    states = ring.simulate(n)
    assert len(states) == 2 * (n - 1) + 1
    everyone = frozenset(range(n))
    assert states[0] == tuple(tuple(frozenset({r}) for _ in range(n)) for r in range(n))
    assert all(chunk == everyone for row in states[-1] for chunk in row)


@pytest.mark.parametrize("n", SIZES)
def test_scatter_reduce_leaves_each_rank_owning_one_finished_chunk(n):
    after = ring.simulate(n)[n - 1]
    everyone = frozenset(range(n))
    for r in range(n):
        finished = [c for c in range(n) if after[r][c] == everyone]
        assert finished == [ring.owned_after_scatter_reduce(r, n)]


@pytest.mark.parametrize("n", SIZES)
def test_partial_sums_grow_by_one_rank_per_scatter_reduce_step(n):
    states = ring.simulate(n)
    for s, step in enumerate(ring.schedule(n)[: n - 1]):
        for r in range(n):
            assert len(states[s + 1][r][step.recv[r]]) == s + 2
            # the chunk being sent is never the one being received
            assert step.send[r] != step.recv[r]


def chunk_bytes(size, n):
    """Chunk sizes as torch.tensor_split makes them: the first size % n chunks one larger."""
    return [size // n + (1 if c < size % n else 0) for c in range(n)]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("size", [840, 1001])
def test_bytes_counted_from_the_schedule_match_the_cost_model(n, size):
    chunks = chunk_bytes(size, n)
    sent = [0] * n
    for step in ring.schedule(n):
        for r in range(n):
            sent[r] += chunks[step.send[r]]
    model = ring.bytes_sent_ring(n, size)
    assert model == pytest.approx(2 * (n - 1) / n * size)
    if size % n == 0:
        assert sent == [model] * n
    else:  # uneven chunks: within two chunks' rounding of the model
        assert all(abs(b - model) <= 2 for b in sent)
    assert all(b < 2 * size for b in sent)
    assert ring.bytes_naive(n, size) == (n - 1) * size


@pytest.mark.parametrize("n", SIZES)
def test_the_root_moves_n_times_the_rings_bytes_in_the_same_number_of_messages(n):
    size, alpha, inv_beta = 4e6, 1e-4, 1e-9
    # latency only: both schemes take 2 (N - 1) messages in turn
    assert ring.time_ring(n, size, alpha, 0.0) == ring.time_root(n, size, alpha, 0.0)
    assert ring.time_root(n, size, alpha, 0.0) == pytest.approx(2 * (n - 1) * alpha)
    # bandwidth only: the root receives (N - 1) S, then sends (N - 1) S; a ring rank sends and
    # receives its 2 (N - 1) / N S at once
    root_bytes = ring.time_root(n, size, 0.0, inv_beta) / inv_beta
    assert root_bytes == pytest.approx(2 * ring.bytes_naive(n, size))
    assert ring.time_root(n, size, 0.0, inv_beta) == pytest.approx(
        n * ring.time_ring(n, size, 0.0, inv_beta))


def test_two_ranks_the_root_takes_twice_the_rings_bandwidth_time():
    assert ring.bytes_naive(2, 100) == ring.bytes_sent_ring(2, 100)  # the same bytes sent ...
    assert ring.time_root(2, 100, 0.0, 1.0) == 2 * ring.time_ring(2, 100, 0.0, 1.0)  # ... in turn


def test_one_rank_has_nothing_to_do():
    assert ring.schedule(1) == []
    assert ring.simulate(1) == [((frozenset({0}),),)]
    assert ring.bytes_sent_ring(1, 100) == 0 == ring.bytes_naive(1, 100)
    assert ring.time_ring(1, 100, 1.0, 1.0) == 0 == ring.time_root(1, 100, 1.0, 1.0)


def test_the_schedule_for_three_ranks_by_hand():
    steps = ring.schedule(3)
    assert [(s.send, s.recv) for s in steps] == [
        ((0, 1, 2), (2, 0, 1)),
        ((2, 0, 1), (1, 2, 0)),
        ((1, 2, 0), (0, 1, 2)),
        ((0, 1, 2), (2, 0, 1)),
    ]


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "4"])
def test_a_world_size_below_one_or_not_an_integer_is_refused(bad):
    with pytest.raises(ValueError, match="world_size"):
        ring.schedule(bad)
    with pytest.raises(ValueError, match="world_size"):
        ring.bytes_sent_ring(bad, 10)
    with pytest.raises(ValueError, match="world_size"):
        ring.time_root(bad, 10, 1.0, 1.0)
