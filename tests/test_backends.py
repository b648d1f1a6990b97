"""eagle/backends: which backend a name stands for on a device, and the eager backend as the
reference: a Target on the CPU backend (each of its GEMM and argmax ways, forced through its own
arguments) gives the eager Target's logits, features and greedy tokens on random trees of every
tiny architecture, with static and dynamic caches."""
from __future__ import annotations

import copy

import pytest
import torch

from eagle import Target, TreeDecoder
from eagle.backends import BACKENDS, BackendError, make_backend, resolve_backend
from eagle.backends.cpu import CpuBackend
from eagle.backends.eager import EagerBackend
from eagle.config import ConfigError, DecodeConfig, from_dict
from eagle.runtime import RuntimeConfig
from eagle_kernels import cpu_gemm
from eagle_kernels.onednn import packed_gemm_available

from conftest import ARCHS, TINY_VOCAB, make_random_tree

V = TINY_VOCAB
PREFIX = 24  # longer than the tiny models' sliding windows (conftest: 8 and 12)


# ------------------------------------------------------------------------------------------------
# names: auto, explicit, unknown
# ------------------------------------------------------------------------------------------------


def test_auto_takes_the_cpu_backend_where_it_is_preferred(monkeypatch):
    want = "cpu" if CpuBackend.preferred("cpu") else "eager"
    assert resolve_backend("auto", "cpu") == want
    assert type(make_backend("auto", "cpu")) is (CpuBackend if want == "cpu" else EagerBackend)
    for preferred, name in ((True, "cpu"), (False, "eager")):  # both answers, whatever this machine is
        monkeypatch.setattr(CpuBackend, "preferred", classmethod(lambda cls, device, p=preferred: p))
        assert resolve_backend("auto", "cpu") == name
        assert resolve_backend("auto", torch.device("cpu")) == name


def test_explicit_names_make_their_backend_with_its_options():
    assert resolve_backend("eager", "cpu") == "eager" and type(make_backend("eager", "cpu")) is EagerBackend
    assert resolve_backend("cpu", "cpu") == "cpu"
    cpu = make_backend("cpu", "cpu", linear="stream", argmax="kernel")
    assert type(cpu) is CpuBackend and (cpu.linear, cpu.argmax) == ("stream", "kernel")
    assert make_backend("cpu") is not make_backend("cpu")  # one per Target: it holds that model's copies


def test_a_backend_that_cannot_run_here_is_one_line_naming_it():
    with pytest.raises(BackendError, match=r"^runtime.backend 'cuda' cannot run here: the model is on 'cpu'"):
        resolve_backend("cuda", "cpu")
    with pytest.raises(BackendError, match=r"^runtime.backend 'cpu' cannot run here: the model is on 'meta', not the CPU"):
        resolve_backend("cpu", "meta")
    try:
        make_backend("cuda", "cpu")
    except BackendError as e:
        assert "\n" not in str(e) and isinstance(e, ValueError)
    else:
        raise AssertionError("the cuda backend was made for a CPU model")


def test_an_unknown_name_is_an_error_naming_the_choices():
    with pytest.raises(BackendError, match=r"runtime.backend must be one of .*got 'tpu'"):
        resolve_backend("tpu", "cpu")
    with pytest.raises(BackendError, match="got 'tpu'"):
        make_backend("tpu")
    assert BACKENDS == ("auto", "eager", "cpu", "cuda")


def test_the_runtime_config_checks_the_name():
    with pytest.raises(ValueError, match=r"runtime.backend must be one of .*got 'x'"):
        RuntimeConfig(backend="x").validate()
    with pytest.raises(ConfigError, match="runtime.backend"):
        from_dict(DecodeConfig, {"runtime": {"backend": "x"}}).validate()
    for name in BACKENDS:
        RuntimeConfig(backend=name).validate()


def test_a_target_or_decoder_asked_for_cuda_on_the_cpu_is_refused(tiny_model):
    model = tiny_model("llama")
    with pytest.raises(BackendError, match="runtime.backend 'cuda' cannot run here"):
        Target(model, "reference", RuntimeConfig(backend="cuda"))
    with pytest.raises(BackendError, match="runtime.backend 'cuda' cannot run here"):
        TreeDecoder.from_config(model, {"runtime": {"backend": "cuda"}})
    assert type(Target(model, "reference", RuntimeConfig(backend="eager")).backend) is EagerBackend


@pytest.mark.parametrize("option", ["linear", "argmax"])
def test_cpu_backend_options_are_checked(option):
    with pytest.raises(ValueError, match=rf"CPU backend {option} way must be one of .*got 'bogus'"):
        CpuBackend(**{option: "bogus"})
    with pytest.raises(ValueError, match=rf"CPU backend {option} way must be one of"):
        make_backend("cpu", "cpu", **{option: "bogus"})


def test_cpu_backend_defaults_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("EAGLE_CPU_LINEAR", "never")
    monkeypatch.setenv("EAGLE_CPU_ARGMAX", "dot")
    assert (CpuBackend().linear, CpuBackend().argmax) == ("never", "dot")
    assert CpuBackend(linear="stream").linear == "stream"  # an argument wins
    monkeypatch.setenv("EAGLE_CPU_LINEAR", "fast")
    with pytest.raises(ValueError, match="got 'fast'"):
        CpuBackend()


# ------------------------------------------------------------------------------------------------
# the eager backend is the reference
# ------------------------------------------------------------------------------------------------

# (linear, argmax) ways of the CPU backend; a forced way this machine lacks falls back (plain GEMM,
# the kernel's screen), which must give the same results too; "measure" is the default way
CPU_WAYS = [("never", "kernel"), ("always", "onednn"), ("stream", "dot"), ("measure", "measure")]


def _expected_rows(backend: CpuBackend, linear: str, buckets) -> None:
    """The forced linear way is the one the backend's twin runs (a fresh model: twins are per model)."""
    buckets = set(buckets)
    if linear == "never":
        assert backend.twin is None and backend.twin_rows == frozenset()
    elif linear == "stream" and cpu_gemm.available():
        assert backend.stream_rows == buckets == backend.twin_rows
    elif linear == "always" and packed_gemm_available():
        assert backend.packed_rows == {b for b in buckets if b >= 4} == backend.twin_rows


def _trees(gen: torch.Generator):
    """A chain deeper than the sliding windows, a random tree of at most two children per node, a
    wide random tree, and a single node."""
    return [make_random_tree(16, V, gen, max_children=1), make_random_tree(20, V, gen, max_children=2),
            make_random_tree(9, V, gen), make_random_tree(1, V, gen)]


@pytest.mark.parametrize("linear,argmax", CPU_WAYS, ids=[f"{a}-{b}" for a, b in CPU_WAYS])
@pytest.mark.parametrize("cache_kind", ["static", "dynamic"])
@pytest.mark.parametrize("arch", ARCHS)
def test_cpu_backend_equals_the_eager_backend(arch, cache_kind, linear, argmax, tiny_model):
    """Prefill, then random trees one after another (each followed by a commit of one of its
    root-to-node paths, so later trees see committed tree nodes): the same last-position and tree
    logits (atol 1e-4), final features and requested layers, and the same greedy argmax (the CPU
    backend's screened argmax against the eager logits' argmax)."""
    model = tiny_model(arch)
    runtime = RuntimeConfig(cache=cache_kind)
    ref = Target(model, "reference", runtime, backend=EagerBackend())
    backend = CpuBackend(linear=linear, argmax=argmax)
    cpu = Target(copy.deepcopy(model), "reference", RuntimeConfig(cache=cache_kind), backend=backend)
    assert cpu.backend is backend and type(ref.backend) is EagerBackend
    if cache_kind == "static":
        _expected_rows(backend, linear, runtime.buckets)
    else:
        assert backend.twin is None  # a dynamic cache runs the model's own layers
    gen = torch.Generator().manual_seed(ARCHS.index(arch) * 10 + (cache_kind == "static"))
    prefix = torch.randint(0, V, (PREFIX,), generator=gen)
    caches = {t: t.new_cache(128) for t in (ref, cpu)}
    a, b = (t.prefill(prefix, caches[t], layers=(1, 2)) for t in (ref, cpu))
    torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(b.layers, a.layers, atol=1e-4, rtol=0)
    b_fresh = cpu.prefill(prefix, cpu.new_cache(128))  # greedy before any logit is computed
    assert torch.equal(b_fresh.greedy(), a.logits.argmax(-1)) and torch.equal(b.greedy(), a.greedy())
    length = PREFIX
    for tree in _trees(gen):
        a, b = (t.tree_forward(tree, caches[t], layers=(1,)) for t in (ref, cpu))
        greedy = b.greedy()  # before b.logits: the screen where it applies
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(b.hidden, a.hidden, atol=1e-4, rtol=0)
        torch.testing.assert_close(b.layers, a.layers, atol=1e-4, rtol=0)
        assert greedy.shape == (len(tree),) and torch.equal(greedy, a.logits.argmax(-1))
        keep = tree.path_to(int(torch.randint(0, len(tree), (), generator=gen)))
        for t in (ref, cpu):
            t.commit(caches[t], length, keep)
        length += len(keep)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_cpu_backend_equals_the_eager_backend_across_bucket_sizes(arch, tiny_model):
    """Every node count from 1 to the largest bucket (padded steps of every bucket) gives the eager
    logits and greedy tokens, with the CPU backend's default ways."""
    model = tiny_model(arch)
    ref = Target(model, "reference", RuntimeConfig(buckets=[1, 4, 8, 16]), backend=EagerBackend())
    cpu = Target(copy.deepcopy(model), "reference", RuntimeConfig(buckets=[1, 4, 8, 16]), backend=CpuBackend())
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, V, (PREFIX,), generator=gen)
    caches = {t: t.new_cache(64) for t in (ref, cpu)}
    for t in (ref, cpu):
        t.prefill(prefix, caches[t])
    for n in range(1, 18):
        tree = make_random_tree(n, V, gen)
        a, b = (t.tree_forward(tree, caches[t]) for t in (ref, cpu))
        greedy = b.greedy()
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
        assert torch.equal(greedy, a.logits.argmax(-1)), n
        for t in (ref, cpu):
            t.crop(caches[t], PREFIX)


def test_one_backends_linear_way_does_not_change_anothers_on_the_same_model(tiny_model):
    """Twins are shared per model and ``linear`` setting: a backend that streams every bucket and
    one that packs them with MKL, on the same model, each keep their own choice."""
    if not (cpu_gemm.available() and packed_gemm_available()):
        pytest.skip("needs both the small-row kernel and MKL's packed GEMM")
    model = copy.deepcopy(tiny_model("llama"))
    runtime = RuntimeConfig(buckets=[1, 4, 8])
    stream = Target(model, "reference", runtime, backend=CpuBackend(linear="stream")).backend
    always = Target(model, "reference", runtime, backend=CpuBackend(linear="always")).backend
    assert stream.stream_rows == {1, 4, 8} and not stream.packed_rows
    assert always.packed_rows == {4, 8} and not always.stream_rows
    assert stream.twin is not always.twin
    again = Target(model, "reference", runtime, backend=CpuBackend(linear="stream")).backend
    assert again.twin is stream.twin  # the same choice: one twin, packed copies made once


def test_last_level_cache_size_and_timing_with_eviction(tmp_path):
    """``last_level_cache_bytes`` reads the largest cache of CPU 0 from sysfs (a default where it
    cannot); ``timed_pass(before=...)`` calls ``before`` untimed before every timed call."""
    from eagle_kernels.cpuinfo import last_level_cache_bytes
    from eagle_kernels.timing import timed_pass

    for i, size in enumerate(["48K", "2048K", "260M", "junk"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(str(tmp_path)) == 260 << 20
    assert last_level_cache_bytes(str(tmp_path / "none"), default=123) == 123
    calls = []
    best = timed_pass([lambda: calls.append("a"), lambda: calls.append("b")], 2, before=lambda: calls.append("evict"))
    assert calls == ["a", "b"] + ["evict", "a", "evict", "b"] * 2 and len(best) == 2
