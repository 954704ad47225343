"""ResumableSampler: deterministic epochs, mid-epoch start, rank sharding."""

from olingo.dataset.sampler import ResumableSampler


def test_epochs_differ_and_repeat_deterministically():
    a, b = ResumableSampler(20, seed=3), ResumableSampler(20, seed=3)
    a.set_epoch(0)
    b.set_epoch(0)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(a) == list(range(20))


def test_start_skips_consumed_samples_for_that_epoch_only():
    sampler = ResumableSampler(20, seed=1)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.set_epoch(2, start=8)
    assert list(sampler) == full[8:] and len(sampler) == 12
    sampler.set_epoch(3)  # the next epoch sees every sample again
    assert sorted(sampler) == list(range(20))


def test_ranks_partition_the_global_order_and_resume_across_world_sizes():
    single = ResumableSampler(16, seed=0)
    single.set_epoch(0)
    order = list(single)
    ranks = [ResumableSampler(16, num_replicas=2, rank=r, seed=0) for r in range(2)]
    for r in ranks:
        r.set_epoch(0)
    assert list(ranks[0]) == order[0::2] and list(ranks[1]) == order[1::2]
    # after 2 batches of 2 per rank (8 global samples) a 1-rank resume continues the same order
    single.set_epoch(0, start=8)
    assert list(single) == order[8:]


def test_even_pads_and_uneven_does_not():
    even = [ResumableSampler(5, num_replicas=2, rank=r, shuffle=False) for r in range(2)]
    assert [list(s) for s in even] == [[0, 2, 4], [1, 3, 0]]
    uneven = [ResumableSampler(5, num_replicas=2, rank=r, shuffle=False, even=False) for r in range(2)]
    assert [list(s) for s in uneven] == [[0, 2, 4], [1, 3]]
    assert [len(s) for s in uneven] == [3, 2]
