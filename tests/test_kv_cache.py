"""The page pool hands each page to one owner at a time and gets every page back exactly once."""
import pytest

from slipstream.kv_cache import SCRATCH_PAGE, OutOfPages, PagePool


def test_scratch_page_is_never_handed_out():
    pool = PagePool(8, 16)
    pages = pool.allocate(pool.total)
    assert SCRATCH_PAGE not in pages and len(set(pages)) == 7
    with pytest.raises(OutOfPages):
        pool.allocate(1)


def test_every_page_is_freed_exactly_once():
    pool = PagePool(8, 16)
    pages = pool.allocate(3)
    pool.free(pages)
    assert pool.num_free == pool.total
    with pytest.raises(AssertionError, match="freed twice"):
        pool.free(pages[:1])


def test_pages_for_rounds_up():
    pool = PagePool(8, 16)
    assert [pool.pages_for(n) for n in (1, 16, 17, 32)] == [1, 1, 2, 2]
