"""KVCache: preallocated storage, O(1) rollback, compaction after a tree step."""
import pytest
import torch

from specdecode.cache import KVCache


def make_cache(max_len=16, n_layers=2, n_kv_heads=2, head_dim=4):
    return KVCache(n_layers, n_kv_heads, head_dim, max_len, torch.float32, "cpu")


def block(start, length, n_kv_heads=2, head_dim=4, sign=1.0):
    """[n_kv_heads, length, head_dim] whose entries encode their absolute position."""
    positions = torch.arange(start, start + length, dtype=torch.float32)
    return sign * positions[None, :, None].expand(n_kv_heads, length, head_dim).clone()


def test_preallocated_and_empty():
    cache = make_cache(max_len=16)
    assert cache.keys.shape == (2, 2, 16, 4) and cache.values.shape == (2, 2, 16, 4)
    assert cache.length == 0 and cache.room == 16


def test_write_then_view_returns_written_entries():
    cache = make_cache()
    for layer in range(2):
        cache.write(layer, 0, block(0, 5), block(0, 5, sign=-1))
    cache.length = 5
    keys, values = cache.view(1, 5)
    assert torch.equal(keys, block(0, 5)) and torch.equal(values, block(0, 5, sign=-1))
    # a view covers exactly the positions asked for and shares storage (no copy)
    assert keys.shape[1] == 5
    assert keys.data_ptr() == cache.keys[1].data_ptr()


def test_truncate_rolls_back_without_copying():
    cache = make_cache()
    cache.write(0, 0, block(0, 8), block(0, 8))
    cache.length = 8
    storage = cache.keys.data_ptr()
    cache.truncate(3)
    assert cache.length == 3 and cache.room == 13
    assert cache.keys.data_ptr() == storage
    # the next block overwrites the stale entries
    cache.write(0, 3, block(100, 2), block(100, 2))
    cache.length = 5
    keys, _ = cache.view(0, 5)
    assert torch.equal(keys[:, :3], block(0, 3)) and torch.equal(keys[:, 3:], block(100, 2))


@pytest.mark.parametrize("bad", [-1, 9])
def test_truncate_rejects_out_of_range(bad):
    cache = make_cache()
    cache.length = 8
    with pytest.raises(ValueError):
        cache.truncate(bad)
    assert cache.length == 8


def test_truncate_to_same_length_and_zero():
    cache = make_cache()
    cache.length = 4
    cache.truncate(4)
    assert cache.length == 4
    cache.truncate(0)
    assert cache.length == 0


def test_compact_keeps_selected_block_entries_in_order():
    cache = make_cache()
    for layer in range(2):
        cache.write(layer, 0, block(0, 10), block(0, 10, sign=-1))
    cache.length = 10
    # a tree block occupied positions 4..9; the accepted path is at offsets 0, 2, 5
    cache.compact(4, [0, 2, 5])
    assert cache.length == 7
    for layer in range(2):
        keys, values = cache.view(layer, 7)
        expected = torch.cat([block(0, 4), block(4, 1), block(6, 1), block(9, 1)], dim=1)
        assert torch.equal(keys, expected)
        assert torch.equal(values, -expected)


def test_compact_of_a_prefix_only_moves_the_length():
    cache = make_cache()
    cache.write(0, 0, block(0, 10), block(0, 10))
    cache.length = 10
    before = cache.keys.clone()
    cache.compact(4, [0, 1, 2])
    assert cache.length == 7
    assert torch.equal(cache.keys, before)


def test_compact_to_nothing():
    cache = make_cache()
    cache.length = 10
    cache.compact(6, [])
    assert cache.length == 6
