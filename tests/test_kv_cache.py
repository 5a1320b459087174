"""The page pool holds pages by reference count and gets every one back exactly once; with caching,
a registered page nobody holds stays findable by its key until an allocation evicts it, least
recently released first, and a held page is never evicted. Keys chain: equal keys, equal tokens
from the start."""
import pytest

from slipstream.kv_cache import SCRATCH_PAGE, OutOfPages, PagePool, chain_keys


def test_scratch_page_is_never_handed_out():
    pool = PagePool(8, 16)
    pages = pool.allocate(pool.total)
    assert SCRATCH_PAGE not in pages and len(set(pages)) == 7
    with pytest.raises(OutOfPages):
        pool.allocate(1)


def test_every_page_is_released_as_often_as_it_is_held():
    pool = PagePool(8, 16)
    pages = pool.allocate(3)
    pool.hold(pages[:1])
    pool.release(pages)
    assert pool.num_free == pool.total - 1
    pool.release(pages[:1])
    assert pool.num_free == pool.total
    with pytest.raises(AssertionError, match="released more often than held"):
        pool.release(pages[:1])


def test_pages_for_rounds_up():
    pool = PagePool(8, 16)
    assert [pool.pages_for(n) for n in (1, 16, 17, 32)] == [1, 1, 2, 2]


def test_keys_chain_over_full_pages():
    a = chain_keys(list(range(10)), 4)
    assert len(a) == 2  # (the partial third page has none)
    b = chain_keys([0, 1, 2, 3, 4, 5, 6, 99, 8], 4)
    assert a[0] == b[0] and a[1] != b[1]
    c = chain_keys([9, 1, 2, 3, 4, 5, 6, 7], 4)
    assert c[0] != a[0] and c[1] != a[1]  # (same second page, another start)
    assert chain_keys(list(range(8)), 4, salt=b"lora") != a
    with_image = chain_keys(list(range(8)), 4, extra=b"image", extra_until=5)
    assert with_image[0] != a[0] and with_image[1] != a[1]
    assert chain_keys(list(range(12)), 4, keys=a[:1]) == chain_keys(list(range(12)), 4)


def test_a_released_registered_page_stays_findable_until_evicted_oldest_first():
    pool = PagePool(5, 4, caching=True)  # 4 pages to hand out
    keys = chain_keys(list(range(16)), 4)
    pages = pool.allocate(4)
    for page, key in zip(pages, keys):
        pool.register(page, key)
    pool.release(pages[::-1])  # (back to front: the deepest page is the oldest released)
    assert pool.num_free == 4 and pool.num_cached == 4
    assert pool.lookup(keys) == pages and pool.unheld(pages) == 4
    pool.hold(pages[:2])
    assert pool.num_free == 2
    (new,) = pool.allocate(1)
    assert new == pages[3] and pool.lookup(keys) == pages[:3]  # the deepest went first
    assert pool.lookup(keys[1:]) == pages[1:3]
    pool.allocate(1)
    with pytest.raises(OutOfPages):  # (the held ones are not evictable)
        pool.allocate(1)
    assert pool.lookup(keys) == pages[:2]


def test_a_key_keeps_its_first_page_and_caching_off_registers_nothing():
    pool = PagePool(5, 4, caching=True)
    (key,) = chain_keys([1, 2, 3, 4], 4)
    a, b = pool.allocate(2)
    pool.register(a, key)
    pool.register(b, key)
    assert pool.lookup([key]) == [a] and pool.num_cached == 1
    pool.release([b])
    assert pool.unheld([b]) == 0  # (b is simply free)
    off = PagePool(5, 4)
    (page,) = off.allocate(1)
    off.register(page, key)
    assert off.lookup([key]) == [] and off.num_cached == 0
