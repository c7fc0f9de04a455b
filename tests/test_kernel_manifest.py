"""The kernel manifest against what the libraries contain.

On the CPU (libepifuse_core): every line of plugins/kernels/sm90/kernels.def and sm80/kernels.def is
a registry rule in each of its dtypes, in the manifest's order, and the registry has no kernel of
those families that the manifests lack.
With a CUDA build at hand (EPIFUSE_LIB_DIR or the installed wheel; no GPU needed, CI runs it on its
compile check): every registered CUDA kernel has an implementation in the build (for the 16-bit types
the build was made for, EPIFUSE_CUDA_DTYPES) and every implementation is registered.
"""
from __future__ import annotations

import re

import pytest

from optimizer import registry
from optimizer.libraries import CUDA_LIBRARY, LibraryNotFound, library_path
from tests.helpers import kernel_manifest, sm90_manifest

TWINS = {"F16_BF16": ("f16", "bf16"), "F32_3XTF32": ("f32",), "F32_TF32": ("tf32",)}


def test_manifest_lines_are_the_registry_sm90_kernels_in_order():
    manifest = [f"sm90_{dtype}_{e['name']}" for e in sm90_manifest() for dtype in TWINS[e["dtypes"]]]
    assert any(n.startswith("sm90_tf32_") for n in manifest)
    for target in ("ort-cuda", "tensorrt"):
        registered = [n for n in registry.registered_kernels(target) if n.startswith("sm90_")]
        assert registered == manifest, target
    assert not any(n.startswith("sm90_") for n in registry.registered_kernels("ort-cpu"))


def test_sm80_manifest_lines_are_the_registry_sm80_kernels_in_order():
    manifest = [f"sm80_{dtype}_{e['name']}" for e in kernel_manifest("sm80") for dtype in TWINS[e["dtypes"]]]
    assert len(manifest) > 10
    for target in ("ort-cuda", "tensorrt"):
        assert [n for n in registry.registered_kernels(target) if n.startswith("sm80_")] == manifest, target


def test_manifest_names_are_unique_and_columns_known():
    entries = sm90_manifest()
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)) and len(names) > 10
    for e in entries:
        assert e["acts"] in ("ANY", "RELU", "SILU") and e["tu"] in ("PLAIN", "EXTENDED_MMA", "NO_PDL"), e
        assert e["dtypes"] in ("F16_BF16", "F32_TF32"), e
        assert e.get("residual", "RESIDUAL") in ("RESIDUAL", "NO_RESIDUAL"), e
        assert re.fullmatch(r"nullptr|prefer_\w+", e["prefer"]), e
    sm80 = kernel_manifest("sm80")
    assert len({e["name"] for e in sm80}) == len(sm80)
    assert all(e["kind"] in ("ALIGNED", "FIXED8", "FEWCH", "UNALIGNED", "SPLITK", "GROUPED") for e in sm80), sm80


def test_registered_kernels_rejects_an_unknown_target():
    with pytest.raises(ValueError, match="unknown target"):
        registry.registered_kernels("ort-tpu")


def _compiled() -> list[str]:
    try:
        library_path(CUDA_LIBRARY)
    except LibraryNotFound as e:
        pytest.skip(f"no CUDA build of the library: {e}"[:200])
    from optimizer import cuda

    return cuda.compiled_kernels()


def _dtype_of(name: str) -> str | None:
    m = re.search(r"_(f16|bf16|f32|tf32)_", name)
    return m.group(1) if m else None


def test_every_registered_cuda_kernel_is_compiled_and_every_compiled_one_registered():
    compiled = _compiled()
    assert len(compiled) == len(set(compiled)), "a kernel name is compiled twice"
    registered = set(registry.registered_kernels("ort-cuda")) | set(registry.registered_kernels("tensorrt"))
    unreachable = [n for n in compiled if n not in registered]
    assert not unreachable, f"compiled kernels no registry rule names: {unreachable}"
    # The 16-bit twins the build has (EPIFUSE_CUDA_DTYPES), from its CUTLASS kernels' names.
    built = {_dtype_of(n) for n in compiled if n.startswith(("sm90_", "sm80_"))} - {None}
    assert built, f"no CUTLASS kernel in the build: {compiled}"
    wanted = [n for n in registered if _dtype_of(n) in built | {"f32", "tf32", None}]  # fp32 lines: always built
    if not any(n.startswith("sm90_") for n in compiled):  # built without sm_90a: no SM90 kernels, by design
        wanted = [n for n in wanted if "sm90_" not in n]
    missing = [n for n in wanted if n not in compiled]
    assert not missing, f"registered kernels without an implementation in this build: {missing}"
