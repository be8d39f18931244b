"""Shared helpers for the tests: random attention inputs and the error measure they are judged by."""

import pytest
import torch


def make_qkv(B, Hq, Hkv, N, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g)
    k = torch.randn(B, Hkv, N, D, generator=g)
    v = torch.randn(B, Hkv, N, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def rel_err(out, ref):
    """Max abs error relative to the reference output's scale (max abs value)."""
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and a busy 2-core machine makes two threads slow."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def qkv():
    return make_qkv
